//! Several simulated engines in one process, each with its own ranks, caches, sockets
//! and tasks: a fleet of hundreds of ranks for tests and benchmarks on one machine.

use super::config::SimConfig;
use super::launch::{StartError, start};
use super::running::RunningEngine;

/// The most engines one process runs.
pub const MAX_ENGINES: u32 = 4096;

/// Settings of the engines of one process: `engines` engines of the same settings,
/// engine `i` on its own ports. Every field is a `switchyard sim-engine` flag.
#[derive(Debug, Clone, clap::Args)]
#[non_exhaustive]
pub struct FleetConfig {
    /// Simulated engines in this process. Engine i serves HTTP on --port + i (and
    /// --admin-port + i, --bootstrap-port + i) and binds its ranks' KV-event, replay
    /// and load sockets from base + i x --dp-size; a port or base of 0 stays 0 (any
    /// free port) for every engine.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_ENGINES)))]
    pub engines: u32,
    /// The settings every engine shares.
    #[command(flatten)]
    pub engine: SimConfig,
}

impl FleetConfig {
    /// `engines` engines of `engine`'s settings.
    pub fn new(engines: u32, engine: SimConfig) -> Self {
        Self { engines, engine }
    }

    /// The settings of engine `i`: its ports moved past those of the engines before
    /// it, and its seed `--seed + i` (its faults' draws and synthetic pages its own).
    ///
    /// # Errors
    /// A message naming the flag whose ports would pass 65535.
    pub fn engine_config(&self, i: u32) -> Result<SimConfig, String> {
        let base = &self.engine;
        let mut config = base.clone();
        let step = |flag: &str, port: u16, stride: u32| -> Result<u16, String> {
            if port == 0 {
                return Ok(0);
            }
            u32::from(port)
                .checked_add(i * stride)
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| p.checked_add((stride - 1) as u16).is_some())
                .ok_or_else(|| format!("{flag} {port}: engine {i}'s ports pass 65535"))
        };
        let ranks = base.dp_size;
        config.port = step("--port", base.port, 1)?;
        config.admin_port = base
            .admin_port
            .map(|p| step("--admin-port", p, 1))
            .transpose()?;
        config.bootstrap_port = base
            .bootstrap_port
            .map(|p| step("--bootstrap-port", p, 1))
            .transpose()?;
        config.kv_port = base
            .kv_port
            .map(|p| step("--kv-port", p, ranks))
            .transpose()?;
        config.replay_port = base
            .replay_port
            .map(|p| step("--replay-port", p, ranks))
            .transpose()?;
        config.load_port = base
            .load_port
            .map(|p| step("--load-port", p, ranks))
            .transpose()?;
        config.seed = base.seed.wrapping_add(u64::from(i));
        Ok(config)
    }
}

/// Starts every engine of `config`, in order; if one cannot start, those started
/// are shut down and its error returned.
///
/// # Errors
/// See [`StartError`].
pub async fn start_fleet(config: &FleetConfig) -> Result<Vec<RunningEngine>, StartError> {
    let mut engines = Vec::with_capacity(config.engines as usize);
    for i in 0..config.engines {
        let started = match config.engine_config(i) {
            Ok(engine) => start(engine).await,
            Err(e) => Err(StartError::Config(e)),
        };
        match started {
            Ok(engine) => engines.push(engine),
            Err(e) => {
                for engine in engines {
                    engine.shutdown().await;
                }
                return Err(e);
            }
        }
    }
    Ok(engines)
}
