//! Why a simulation could not run.

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The engine configuration is invalid.
    #[error("engine: {0}")]
    Engine(#[from] crate::engine::EngineConfigError),
    /// The router configuration is invalid.
    #[error("router: {0}")]
    Router(#[from] kvroute_core::ConfigError),
    /// A pod could not be registered.
    #[error("pod: {0}")]
    Pod(#[from] kvroute_core::RegistryError),
    /// No pod, or too many.
    #[error("a cluster needs between 1 and 4096 pods, got {0}")]
    PodCount(usize),
    /// The admission policy is invalid.
    #[error("admission: {0}")]
    Admission(#[from] kvroute_core::AdmissionPolicyError),
    /// `pod_engines` names a pod the cluster does not have.
    #[error("engine settings for {0:?}, which is not a pod of the cluster")]
    UnknownPod(String),
    /// A trace line names a pod the cluster does not have (at the start).
    #[error("trace line {line}: no pod {pod:?} in the cluster at the start")]
    TracePod {
        /// 1-based line of the trace.
        line: usize,
        /// The name.
        pod: String,
    },
    /// A pod line cannot happen (see `cluster/pod_events.rs`).
    #[error("trace line {line}: {message}")]
    PodEvent {
        /// 1-based line of the trace.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A pod's engine has another block size than the cluster's.
    #[error("pod {pod:?}: block size {block_size}, the cluster's is {expected} (one block size for every replica)")]
    PodBlockSize {
        /// The pod.
        pod: String,
        /// Its engine's block size.
        block_size: u32,
        /// The cluster's.
        expected: u32,
    },
    /// The client cap is zero.
    #[error("the client in-flight cap must be at least 1")]
    ClientCap,
    /// A request's `routing-strategy` header is invalid.
    #[error("request {index}: {source}")]
    Strategy {
        /// 1-based request number.
        index: usize,
        /// The parse error.
        source: kvroute_core::StrategyError,
    },
    /// The engine's block size cannot key token blocks ([`super::RouterBlocks::Tokens`]).
    #[error("token blocks: {0}")]
    TokenBlocks(#[from] kvroute_core::InvalidBlockTokens),
    /// The tokenizer refused a priming prompt.
    #[error("priming prompt: {0}")]
    Prime(#[from] kvroute_tokens::EncodeError),
}
