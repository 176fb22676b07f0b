//! The compact encodings against sentence-transformers' own `quantize_embeddings` (6.2.0, NumPy
//! 2.4.6): byte-equal for every vector, dtype and range case of
//! `tests/testdata/quantize/reference.json` (written by `scripts/make_quantize_reference.py`).

use protocol::envelope::OutputDtype;
use protocol::quantize::Ranges;
use protocol::records::Vector;
use serde_json::Value;

fn floats(value: &Value) -> Vec<f32> {
    value.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect()
}

fn ints(value: &Value) -> Vec<i64> {
    value.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect()
}

#[test]
fn every_encoding_equals_quantize_embeddings() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/quantize/reference.json");
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vectors: Vec<Vec<f32>> = reference["vectors"].as_array().unwrap().iter().map(floats).collect();
    let mut compared = 0;
    for case in reference["cases"].as_array().unwrap() {
        let ranges = Ranges::new(floats(&case["min"]), floats(&case["max"])).unwrap();
        for (dtype, name) in
            [(OutputDtype::Int8, "int8"), (OutputDtype::Uint8, "uint8"), (OutputDtype::Binary, "binary"), (OutputDtype::Ubinary, "ubinary")]
        {
            for (row, vector) in vectors.iter().enumerate() {
                let ours: Vec<i64> = match Vector::encode(vector.clone(), dtype, Some(&ranges)).unwrap() {
                    Vector::Int8(v) | Vector::Binary(v) => v.into_iter().map(i64::from).collect(),
                    Vector::Uint8(v) | Vector::Ubinary(v) => v.into_iter().map(i64::from).collect(),
                    other => panic!("{name}: {other:?}"),
                };
                assert_eq!(ours, ints(&case[name][row]), "{} {name} row {row}", case["name"]);
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 2 * 4 * 24);
}
