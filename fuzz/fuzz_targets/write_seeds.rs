//! Not a fuzz target: writes the seed corpora and exits (scripts/fuzz.sh runs it before
//! fuzzing). `EPHEM_FUZZ_SEEDS`: the corpus root (a directory per target is created under it);
//! `EPHEM_FIXTURES`: the shared fixtures; `EPHEM_FUZZ_EXAMPLE_CORPUS`: the example corpus.
#![no_main]
// The init block exits: the (empty) fuzz function is never reached.
#![allow(unreachable_code)]

use std::path::PathBuf;

libfuzzer_sys::fuzz_target!(
    init: {
        let Some(root) = std::env::var_os("EPHEM_FUZZ_SEEDS").map(PathBuf::from) else {
            eprintln!("write_seeds: set EPHEM_FUZZ_SEEDS to the corpus directory");
            std::process::exit(2);
        };
        let sources = ephem_fuzz::seeds::Sources {
            fixtures: std::env::var_os("EPHEM_FIXTURES").map(PathBuf::from),
            example_corpus: std::env::var_os("EPHEM_FUZZ_EXAMPLE_CORPUS").map(PathBuf::from),
        };
        match ephem_fuzz::seeds::write_all(&root, &sources) {
            Ok(counts) => {
                for (target, count) in counts {
                    println!("{target}: {count} seeds");
                }
                std::process::exit(0);
            }
            Err(e) => {
                eprintln!("write_seeds: {e}");
                std::process::exit(1);
            }
        }
    },
    |_data: &[u8]| {}
);
