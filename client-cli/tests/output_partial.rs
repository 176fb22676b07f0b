//! The client writes results under `<name>.partial` and renames them into place. Someone who can
//! write the output's directory (a shared /tmp, a group folder) plants that name as a link to a
//! file of the user's: the client must never write through it.

use std::path::Path;

use ephem_batch_client::output::{OutputFormat, OutputOptions, OutputWriter, ResultsOf};
use protocol::records::{OutputRecord, Vector};

fn write_one(out: &Path) -> Result<(), ephem_batch_client::output::OutputError> {
    let options = OutputOptions { format: OutputFormat::Jsonl, model_id: "m".into(), results_of: ResultsOf::Job(protocol::envelope::JobId([0xab; 16])), dimensions: None, kind: Default::default() };
    let mut writer = OutputWriter::create(out, options)?;
    writer.record(&OutputRecord::Embedding { id: "a".into(), tokens: 2, vector: Vector::F32(vec![0.6, 0.8]) })?;
    writer.finish().map(drop)
}

#[test]
fn a_partial_name_planted_as_a_link_is_never_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "the user's own file\n").unwrap();
    let out = dir.path().join("embeddings.jsonl");
    for planted in ["embeddings.jsonl.partial", "embeddings.errors.jsonl.partial"] {
        std::os::unix::fs::symlink(&victim, dir.path().join(planted)).unwrap();
    }
    write_one(&out).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the user's own file\n", "written through a planted link");
    assert!(std::fs::read_to_string(&out).unwrap().contains("\"id\":\"a\""));
    assert!(!std::fs::symlink_metadata(&out).unwrap().file_type().is_symlink());
}
