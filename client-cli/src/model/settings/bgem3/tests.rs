use std::path::PathBuf;

use super::super::read_settings as read_any;
use super::super::testdata_dirs::{copy_of, edit, refused_field};
use super::*;

fn sealed(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/outputs/bgem3-heads")).join(name)
}

/// The published layout reads as CLS pooling with Normalize, plus both heads: converted to the
/// very safetensors bytes the generator wrote from the same state dicts.
#[test]
fn a_bgem3_directory_reads_as_dense_with_its_two_heads() {
    let dir = copy_of("bgem3");
    let settings = read_any(dir.path()).unwrap();
    assert_eq!((settings.pooling, settings.normalize, settings.dimensions, settings.max_tokens), (Pooling::Cls, true, 36, 512));
    let vocabulary = read_json(&dir.path().join("config.json")).unwrap().unwrap()["vocab_size"].as_u64().unwrap() as u32;
    assert_eq!(settings.outputs(), [(OutputKind::MultiVector, 36), (OutputKind::Sparse, vocabulary)]);
    for head in &settings.heads {
        assert_eq!(head.safetensors, std::fs::read(sealed(head.file)).unwrap(), "{}", head.file);
    }
    // One head alone offers its output alone.
    std::fs::remove_file(dir.path().join("colbert_linear.pt")).unwrap();
    assert_eq!(read_any(dir.path()).unwrap().outputs(), [(OutputKind::Sparse, vocabulary)]);
}

#[test]
fn what_the_engine_does_not_compute_is_refused_by_file_and_field() {
    let cases: [(&str, &str, fn(&mut Value), &str); 4] = [
        ("tokenizer_config.json", "another cls token", |c| c["cls_token"] = "[CLS]".into(), "cls_token"),
        ("tokenizer_config.json", "no unk token", |c| c.as_object_mut().unwrap().remove("unk_token").map(drop).unwrap_or(()), "unk_token"),
        ("config.json", "a BERT body", |c| c["model_type"] = "bert".into(), "model_type"),
        ("1_Pooling/config.json", "mean pooling", |c| {
            c["pooling_mode_cls_token"] = false.into();
            c["pooling_mode_mean_tokens"] = true.into();
        }, "type"),
    ];
    for (file, what, change, field) in cases {
        let dir = copy_of("bgem3");
        edit(dir.path(), file, change);
        assert_eq!(refused_field(dir.path()), field, "{what}");
    }
    // The heads' pickles: swapped (the ColBERT head where the lexical one belongs), another key
    // beside weight and bias, f64 weights, not a torch archive at all.
    let pickles: [(&str, PathBuf, &str); 4] = [
        ("sparse_linear.pt", sealed("../bgem3/colbert_linear.pt"), "weight"),
        ("sparse_linear.pt", sealed("refused-extra-key.pt"), "(keys)"),
        ("sparse_linear.pt", sealed("refused-f64.pt"), "weight"),
        ("colbert_linear.pt", sealed("sparse_linear.safetensors"), "(file)"),
    ];
    for (target, from, field) in pickles {
        let dir = copy_of("bgem3");
        std::fs::copy(&from, dir.path().join(target)).unwrap();
        match read_any(dir.path()) {
            Err(ModelError::Unsupported { path, field: f, .. }) => {
                assert_eq!((f, path.file_name().unwrap().to_str().unwrap()), (field, target), "{}", from.display());
            }
            other => panic!("{}: {other:?}", from.display()),
        }
    }
    // The body as pytorch_model.bin only (as the published bge-m3 once was): refused by name.
    let dir = copy_of("bgem3");
    std::fs::rename(dir.path().join("model.safetensors"), dir.path().join("pytorch_model.bin")).unwrap();
    assert_eq!(refused_field(dir.path()), "(file)");
}
