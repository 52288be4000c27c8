//! Every setting of a simulated engine, as `switchyard sim-engine` flags.

use std::net::IpAddr;
use std::path::PathBuf;

use crate::engine::EngineSpec;
use crate::events::EventForm;
use crate::faults::FaultConfig;
use crate::load_stat::LoadForm;

/// The most synthetic pages a rank caches a second.
const MAX_SYNTHETIC_BLOCKS_PER_SEC: f64 = 100_000.0;

/// Whether the engine serves whole requests or one side of a PD pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineRole {
    /// Serves whole requests.
    Plain,
    /// Prefills prompts and hands the KV cache over through bootstrap rooms.
    Prefill,
    /// Waits for a prefill engine's room, then generates.
    Decode,
}

impl EngineRole {
    /// The `disaggregation_mode` an SGLang server reports for this role.
    pub fn disaggregation_mode(self) -> &'static str {
        match self {
            EngineRole::Plain => "null",
            EngineRole::Prefill => "prefill",
            EngineRole::Decode => "decode",
        }
    }
}

/// How a prefill engine hands a request's KV cache to a decode engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PdProtocol {
    /// SGLang's: both legs at once, meeting in a bootstrap room.
    Sglang,
    /// vLLM's NIXL connector: the prefill answers with `kv_transfer_params`, which the
    /// decode leg brings (no `/server_info`, as on vLLM).
    Vllm,
}

/// Settings of one simulated engine. Every field is a `switchyard sim-engine` flag.
#[derive(Debug, Clone, clap::Args)]
#[non_exhaustive]
pub struct SimConfig {
    /// Address to bind every socket to.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// HTTP port (0 = any free port; the bound ports are printed at start).
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// A second HTTP port serving only /admin/* (0 = any free port), reachable while
    /// the refuse-connections fault closes the main port.
    #[arg(long)]
    pub admin_port: Option<u16>,
    /// Plain, prefill or decode.
    #[arg(long, value_enum, default_value_t = EngineRole::Plain)]
    pub role: EngineRole,
    /// Model name served (the `model` clients send).
    #[arg(long, default_value = "sim-model")]
    pub model: String,
    /// Tokens per KV page; the prefix cache and KV events work in whole pages.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub page_size: u32,
    /// Data-parallel ranks; each has its own scheduler, cache, event and load sockets.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub dp_size: u32,
    /// KV-event PUB base port (rank r binds base + r); absent = no events.
    #[arg(long)]
    pub kv_port: Option<u16>,
    /// KV-event replay ROUTER base port; absent = no replay.
    #[arg(long, requires = "kv_port")]
    pub replay_port: Option<u16>,
    /// LoadStat PUB base port; absent = no load feed. Needs --kv-port, as on SGLang,
    /// because the feed is advertised inside /server_info's kv_events block.
    #[arg(long, requires = "kv_port")]
    pub load_port: Option<u16>,
    /// ZMQ topic of the KV events.
    #[arg(long, default_value = "")]
    pub kv_topic: String,
    /// Batches kept for replay.
    #[arg(long, default_value_t = 10_000)]
    pub replay_buffer: usize,
    /// KV-event encoding.
    #[arg(long, value_enum, default_value_t = EventForm::Map)]
    pub kv_event_form: EventForm,
    /// Load feed encoding.
    #[arg(long, value_enum, default_value_t = LoadForm::Native)]
    pub load_form: LoadForm,
    /// Bootstrap port of a prefill engine's KV hand-over server (0 = any free port).
    #[arg(long)]
    pub bootstrap_port: Option<u16>,
    /// The prefill/decode hand-over (a vLLM prefill engine serves its transfers on
    /// the bootstrap port, its side channel).
    #[arg(long, value_enum, default_value_t = PdProtocol::Sglang)]
    pub pd_protocol: PdProtocol,
    /// The KV transfer backend, reported in `/server_info` as
    /// `disaggregation_transfer_backend`; a decode engine refuses a room prefilled by
    /// an engine of another backend (or another `--page-size`).
    #[arg(long, default_value = "mooncake")]
    pub transfer_backend: String,
    /// How long a decode engine waits for a prefill engine's room, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub bootstrap_timeout_ms: u64,
    /// Path to a Hugging Face tokenizer.json; the chat template is read from
    /// tokenizer_config.json beside it. Absent = a deterministic built-in tokenizer.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// KV-cache capacity in tokens, per rank.
    #[arg(long, default_value_t = 1 << 20)]
    pub kv_capacity_tokens: u64,
    /// Requests that run at once per rank; the rest wait.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_running_requests: u32,
    /// Uncached prompt tokens prefilled per second (0 = instant): per request, or
    /// per rank with `--serial-prefill`.
    #[arg(long, default_value_t = 40_000.0)]
    pub prefill_tokens_per_sec: f64,
    /// Prefill one request at a time per rank, in arrival order, as a GPU whose
    /// prefill throughput its requests share.
    #[arg(long)]
    pub serial_prefill: bool,
    /// Output tokens generated per second per request (0 = instant).
    #[arg(long, default_value_t = 1_000.0)]
    pub decode_tokens_per_sec: f64,
    /// Output tokens generated when the request sets no lower `max_tokens`.
    #[arg(long, default_value_t = 32)]
    pub output_tokens: u32,
    /// LoRA adapters served beside the model (listed in `/v1/models` with the model
    /// as their `parent`): a request names one by `model` (vLLM), `model:adapter`
    /// (SGLang) or `/generate`'s `lora_path`.
    #[arg(long, value_delimiter = ',')]
    pub lora_adapters: Vec<String>,
    /// Pages each rank caches a second without requests (0 = none), published as
    /// KV events (stores, and the evictions that keep the cache within
    /// `--kv-capacity-tokens`) as a request's pages are: a fleet's KV-event load
    /// without its traffic.
    #[arg(long, default_value_t = 0.0)]
    pub synthetic_kv_blocks_per_sec: f64,
    /// Seed of the error-rate fault's random draws.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Faults to start with (all can be changed at runtime via POST /admin/faults).
    #[command(flatten)]
    pub faults: FaultConfig,
}

impl Default for SimConfig {
    fn default() -> Self {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            config: SimConfig,
        }
        Defaults::parse_from(["sim"]).config
    }
}

impl SimConfig {
    /// A plain engine on `127.0.0.1` with every port chosen by the OS and no delays.
    pub fn for_tests() -> Self {
        Self {
            port: 0,
            prefill_tokens_per_sec: 0.0,
            serial_prefill: false,
            decode_tokens_per_sec: 0.0,
            ..Self::default()
        }
    }

    /// Checks combinations clap cannot express.
    ///
    /// # Errors
    /// A message naming the flag at fault.
    pub fn validate(&self) -> Result<(), String> {
        if self.prefill_tokens_per_sec < 0.0 || self.decode_tokens_per_sec < 0.0 {
            return Err(
                "--prefill-tokens-per-sec and --decode-tokens-per-sec must not be negative".into(),
            );
        }
        if !(0.0..=MAX_SYNTHETIC_BLOCKS_PER_SEC).contains(&self.synthetic_kv_blocks_per_sec) {
            return Err(format!(
                "--synthetic-kv-blocks-per-sec must be 0 to {MAX_SYNTHETIC_BLOCKS_PER_SEC}"
            ));
        }
        if !(1..=64).contains(&self.transfer_backend.len())
            || !self.transfer_backend.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err("--transfer-backend must be 1 to 64 bytes of visible ASCII".into());
        }
        if self.role == EngineRole::Prefill && self.bootstrap_port.is_none() {
            return Err("--role prefill needs --bootstrap-port (0 picks a free port)".into());
        }
        if self.role != EngineRole::Prefill && self.bootstrap_port.is_some() {
            return Err("--bootstrap-port is only for --role prefill".into());
        }
        if self.dp_size > 1 {
            for (flag, port) in [
                ("--kv-port", self.kv_port),
                ("--replay-port", self.replay_port),
                ("--load-port", self.load_port),
            ] {
                if port == Some(0) {
                    return Err(format!(
                        "{flag} 0 needs --dp-size 1: ranks bind consecutive ports from a fixed base"
                    ));
                }
            }
        }
        self.faults.validate()
    }

    /// The engine model these settings describe.
    pub(crate) fn engine_spec(&self) -> EngineSpec {
        EngineSpec {
            max_running_requests: self.max_running_requests,
            prefill_tokens_per_sec: self.prefill_tokens_per_sec,
            decode_tokens_per_sec: self.decode_tokens_per_sec,
            kv_capacity_tokens: self.kv_capacity_tokens,
            page_size: self.page_size,
            dp_size: self.dp_size,
            serial_prefill: self.serial_prefill,
        }
    }
}
