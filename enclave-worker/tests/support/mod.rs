//! What the reference tests share: a reference case as the generator scripts write it, and cosine.

/// One text with sentence-transformers' token count, truncation and vector.
pub struct Case {
    pub name: String,
    pub text: String,
    pub tokens: u32,
    pub truncated: bool,
    pub vector: Vec<f32>,
}

/// The `cases` array of a reference file.
pub fn cases(reference: &serde_json::Value) -> Vec<Case> {
    reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_owned(),
            text: c["text"].as_str().unwrap().to_owned(),
            tokens: c["tokens"].as_u64().unwrap() as u32,
            truncated: c["truncated"].as_bool().unwrap(),
            vector: c["vector"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect(),
        })
        .collect()
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
    let na: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}
