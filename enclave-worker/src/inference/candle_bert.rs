//! The reference backend (feature `candle`): `candle_transformers`' `BertModel` over right-padded
//! batches with an attention mask — the straightforward path the fused encoder's tests and
//! benchmark compare against. Not in the worker's own build: onboarding refuses every BERT config
//! the fused encoder does not compute, so no product path needs it, and the enclave's code is
//! smaller without it.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};

use super::InferenceError;

pub(crate) struct CandleBert {
    model: BertModel,
    device: Device,
    /// What the batches are padded with: the tokenizer's padding token, else the config's.
    pad_id: u32,
}

impl CandleBert {
    /// The model; `tokenizer_pad` is the padding token `tokenizer.json` names, if any.
    pub(crate) fn load(config: &[u8], weights: &[u8], tokenizer_pad: Option<u32>) -> Result<Self, InferenceError> {
        let device = Device::Cpu;
        let config: Config = serde_json::from_slice(config).map_err(|e| InferenceError::Config(e.to_string()))?;
        let tensors = candle_core::safetensors::load_buffer(weights, &device).map_err(|e| InferenceError::Weights(e.to_string()))?;
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &device);
        let model = BertModel::load(vb, &config).map_err(|e| InferenceError::Weights(e.to_string()))?;
        Ok(Self { model, device, pad_id: tokenizer_pad.unwrap_or(config.pad_token_id as u32) })
    }

    /// The token states of a batch right-padded to its longest member: `rows × cols × hidden`
    /// values, row `r`'s real tokens first.
    pub(crate) fn forward(&self, batch: &[&[u32]], hidden: usize) -> Result<(Vec<f32>, usize), InferenceError> {
        let rows = batch.len();
        let cols = batch.iter().map(|ids| ids.len()).max().unwrap_or(0).max(1);
        let mut ids = vec![self.pad_id; rows * cols];
        let mut mask = vec![0u32; rows * cols];
        for (row, sequence) in batch.iter().enumerate() {
            let start = row * cols;
            ids[start..start + sequence.len()].copy_from_slice(sequence);
            mask[start..start + sequence.len()].fill(1);
        }
        let forward = || -> candle_core::Result<Vec<f32>> {
            let input_ids = Tensor::from_vec(ids, (rows, cols), &self.device)?;
            let attention_mask = Tensor::from_vec(mask, (rows, cols), &self.device)?;
            let token_type_ids = input_ids.zeros_like()?;
            let states = self.model.forward(&input_ids, &token_type_ids, Some(&attention_mask))?;
            states.flatten_all()?.to_vec1::<f32>()
        };
        let states = forward().map_err(|e| InferenceError::Forward(e.to_string()))?;
        if states.len() != rows * cols * hidden {
            return Err(InferenceError::Forward(format!("output has {} values, expected {rows}×{cols}×{hidden}", states.len())));
        }
        Ok((states, cols))
    }
}

/// What candle's CPU backend will use, process-wide (see the module docs of `inference`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CandleThreads {
    /// Tasks each matrix multiplication is split into (`RAYON_NUM_THREADS`, else physical cores).
    pub gemm_tasks: usize,
    /// Threads of candle's element-wise pool (`CANDLE_NUM_THREADS`, else as above).
    pub elementwise_threads: usize,
}

pub fn candle_thread_settings() -> CandleThreads {
    let gemm_tasks = candle_core::utils::get_num_threads();
    let elementwise_threads = std::env::var("CANDLE_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(gemm_tasks);
    CandleThreads { gemm_tasks, elementwise_threads }
}
