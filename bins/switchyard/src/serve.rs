//! `switchyard serve` and `switchyard config`: run the router from a YAML file or
//! from flags for simple fleets, check a configuration, print its schema.

pub(crate) mod reload;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use router_buckets::DefaultPolicies;
use router_config::{EngineConfig, EngineRole, ModelConfig, RolePolicies, RouterConfig, Secret};
use router_http::ValidatedConfig;
use router_http::file::{MAX_CONFIG_BYTES, Snapshot, read_regular};
use router_policy::PolicyConfig;
use router_state::Role;
use serde_json::json;

/// Options of `switchyard serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// YAML configuration file (see docs/configuration.md). Without it, the fleet
    /// flags below describe one model. SIGHUP reloads it (models, engines, buckets,
    /// policies and the admin token; docs/operations.md).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Reload the configuration file when its content changes (read every second),
    /// as on SIGHUP.
    #[arg(long, requires = "config")]
    watch_config: bool,
    /// A reload takes the file once two reads this many milliseconds apart agree
    /// (10 to 60000; it gives up after ten rereads); a file that does more than add
    /// models or engines must then stay unchanged ten times as long.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=60_000), requires = "config")]
    config_settle_ms: u64,
    /// Address to listen on (overrides the file's `listen`).
    #[arg(long)]
    host: Option<IpAddr>,
    /// Port to listen on (overrides the file's `listen`).
    #[arg(long)]
    port: Option<u16>,
    /// The model name clients send (fleet flags).
    #[arg(long)]
    model: Option<String>,
    /// Plain engines' base URLs (fleet flags).
    #[arg(long, num_args = 1..)]
    worker_urls: Vec<String>,
    /// A prefill engine: `URL [BOOTSTRAP_PORT]` (repeatable; fleet flags).
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = clap::ArgAction::Append)]
    prefill: Vec<String>,
    /// A decode engine's base URL (repeatable; fleet flags).
    #[arg(long, action = clap::ArgAction::Append)]
    decode: Vec<String>,
    /// Policy of every group: round_robin, random, power_of_two, load_based,
    /// cache_aware (plain and prefill groups; needs --tokenizer and engines that
    /// publish KV events).
    #[arg(long)]
    policy: Option<String>,
    /// Policy of prefill groups (overrides --policy).
    #[arg(long)]
    prefill_policy: Option<String>,
    /// Policy of decode groups (overrides --policy).
    #[arg(long)]
    decode_policy: Option<String>,
    /// Cap on requests in flight per engine (admission `max_inflight_requests`).
    #[arg(long)]
    max_in_flight: Option<u64>,
    /// Eligibility filter of earlier routers: `overloaded` is the same as
    /// --max-in-flight; `prefix_cache` was removed.
    #[arg(long, value_enum)]
    filter: Option<Filter>,
    /// The model's tokenizer.json (fleet flags).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Bearer token for /workers, for tests: any user of the host can read it in the
    /// process list. Give `admin.token_file` or `SWITCHYARD_ADMIN_TOKEN` instead
    /// (without any, the admin API is off).
    #[arg(long)]
    admin_token: Option<Secret>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Filter {
    Overloaded,
    PrefixCache,
}

/// The environment variable an admin token may come from.
pub(crate) const ADMIN_TOKEN_ENV: &str = "SWITCHYARD_ADMIN_TOKEN";

pub(crate) fn run(args: ServeArgs) -> anyhow::Result<()> {
    let env_token = std::env::var(ADMIN_TOKEN_ENV).ok();
    // Read before the configuration is, so `--watch-config` sees any change after.
    let started_from = args
        .config
        .as_ref()
        .and_then(|path| read_regular(path, MAX_CONFIG_BYTES).ok())
        .map(Snapshot::into_text);
    let config = config_from(&args, env_token.clone())?;
    let running = config.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let served = runtime.block_on(async {
        // Listening for SIGHUP before startup, so no signal sent meanwhile ends the
        // process; one received during startup reloads the file once it is done.
        let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("listening for SIGHUP")?;
        let router = router_http::start(config).await?;
        let file = reload::File {
            path: args.config.clone(),
            watch: args.watch_config,
            settle: Duration::from_millis(args.config_settle_ms),
        };
        let reloads = tokio::spawn(reload::run(
            Arc::clone(router.context()),
            hangup,
            running,
            started_from,
            file,
            move |config| overridden(config, &args, env_token.clone()),
        ));
        println!(
            "{}",
            json!({"event": "ready", "addr": router.addr(), "picker": router.picker_addr()})
        );
        crate::sim_engine::shutdown_signal().await;
        reloads.abort();
        tracing::info!("shutting down: draining in-flight requests");
        router.shutdown().await;
        anyhow::Ok(())
    });
    // What still runs on a blocking thread is a reload's read or check, which no one
    // waits for: the process does not either.
    runtime.shutdown_background();
    served
}

/// The configuration `args` describe; `env_token` is the admin token from the
/// environment, used when neither the flags nor the file set one.
fn config_from(args: &ServeArgs, env_token: Option<String>) -> anyhow::Result<RouterConfig> {
    if args.admin_token.is_some() {
        tracing::warn!(
            "--admin-token is for tests: any user of this host can read it in the process list; give admin.token_file or {ADMIN_TOKEN_ENV} instead"
        );
    }
    let fleet = args.model.is_some()
        || !args.worker_urls.is_empty()
        || !args.prefill.is_empty()
        || !args.decode.is_empty()
        || args.tokenizer.is_some();
    let config = match (&args.config, fleet) {
        (Some(_), true) => bail!(
            "use either --config or the fleet flags (--model, --worker-urls, --prefill, --decode, --tokenizer)"
        ),
        (Some(path), false) => load(path)?,
        (None, _) => fleet_config(args)?,
    };
    Ok(overridden(config, args, env_token))
}

/// `config` with what the flags and the environment override in it.
fn overridden(
    mut config: RouterConfig,
    args: &ServeArgs,
    env_token: Option<String>,
) -> RouterConfig {
    if args.host.is_some() || args.port.is_some() {
        config.listen = SocketAddr::new(
            args.host.unwrap_or(config.listen.ip()),
            args.port.unwrap_or(config.listen.port()),
        );
    }
    if let Some(token) = &args.admin_token {
        // The flag wins over the file's token, whichever way the file gives it.
        config.admin.token = Some(token.clone());
        config.admin.token_file = None;
    }
    admin_token_from_env(config, env_token)
}

/// `config` with the admin token from the environment (`env_token`) when the file
/// gives none.
pub(crate) fn admin_token_from_env(
    mut config: RouterConfig,
    env_token: Option<String>,
) -> RouterConfig {
    if config.admin.token.is_none() && config.admin.token_file.is_none() {
        config.admin.token = env_token.filter(|t| !t.trim().is_empty()).map(Secret::from);
    }
    config
}

fn fleet_config(args: &ServeArgs) -> anyhow::Result<RouterConfig> {
    let model = args
        .model
        .clone()
        .context("--model is required without --config")?;
    let max_in_flight = match (args.filter, args.max_in_flight) {
        (Some(Filter::PrefixCache), _) => bail!(
            "--filter prefix_cache was removed: use a cache_aware policy with min_matched_tokens (not equivalent to the share filter)"
        ),
        (Some(Filter::Overloaded), None) => bail!("--filter overloaded needs --max-in-flight N"),
        (_, cap) => cap,
    };
    // A role without a named policy keeps its built-in one; --max-in-flight only caps it.
    let builtin = DefaultPolicies::default();
    let policy = |name: Option<&String>, role: Role| -> anyhow::Result<Option<PolicyConfig>> {
        let Some(name) = name.or(args.policy.as_ref()) else {
            return Ok(max_in_flight.map(|cap| {
                let mut p = builtin.for_role(role).clone();
                p.admission_mut().max_inflight_requests = Some(cap);
                p
            }));
        };
        let mut value = json!({"type": name});
        if let Some(cap) = max_in_flight {
            value["admission"] = json!({"max_inflight_requests": cap});
        }
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("--policy {name}: {e}"))
    };
    let mut engines = Vec::new();
    for (i, url) in args.worker_urls.iter().enumerate() {
        engines.push(engine(format!("worker-{i}"), url, EngineRole::Plain, None));
    }
    for (i, chunk) in prefill_pairs(&args.prefill)?.into_iter().enumerate() {
        engines.push(engine(
            format!("prefill-{i}"),
            &chunk.0,
            EngineRole::Prefill,
            chunk.1,
        ));
    }
    for (i, url) in args.decode.iter().enumerate() {
        engines.push(engine(format!("decode-{i}"), url, EngineRole::Decode, None));
    }
    if engines.is_empty() {
        bail!("no engines: pass --worker-urls, or --prefill and --decode, or --config FILE");
    }
    let mut config = RouterConfig::new(vec![ModelConfig {
        tokenizer: args.tokenizer.clone(),
        ..ModelConfig::new(model, engines)
    }]);
    config.policies = RolePolicies {
        plain: policy(None, Role::Plain)?,
        prefill: policy(args.prefill_policy.as_ref(), Role::Prefill)?,
        decode: policy(args.decode_policy.as_ref(), Role::Decode)?,
    };
    Ok(config)
}

/// `--prefill URL [PORT]` occurrences: clap appends values flatly, so a number
/// following a URL is that URL's bootstrap port.
fn prefill_pairs(values: &[String]) -> anyhow::Result<Vec<(String, Option<u16>)>> {
    let mut pairs: Vec<(String, Option<u16>)> = Vec::new();
    for value in values {
        match (value.parse::<u16>(), pairs.last_mut()) {
            (Ok(port), Some(last)) if last.1.is_none() => last.1 = Some(port),
            (Ok(_), _) => bail!("--prefill {value}: a bootstrap port must follow a URL"),
            (Err(_), _) => pairs.push((value.clone(), None)),
        }
    }
    Ok(pairs)
}

fn engine(id: String, url: &str, role: EngineRole, bootstrap_port: Option<u16>) -> EngineConfig {
    EngineConfig {
        role: Some(role),
        bootstrap_port,
        ..EngineConfig::new(id, url.trim_end_matches('/'))
    }
}

/// The configuration in the file at `path`: a regular file of at most 1 MiB.
pub(crate) fn load(path: &Path) -> anyhow::Result<RouterConfig> {
    let file = read_regular(path, MAX_CONFIG_BYTES)
        .with_context(|| format!("reading {}", path.display()))?;
    RouterConfig::from_yaml(file.text()).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// `switchyard config check FILE`: every problem (fields, buckets, policies,
/// tokenizers: what startup would refuse before contacting an engine), then a
/// non-zero exit.
pub(crate) fn check(path: &Path) -> anyhow::Result<()> {
    let config = ValidatedConfig::validate(load(path)?).map_err(|problems| {
        anyhow::anyhow!(
            "{}: {} problem(s)\n  {}",
            path.display(),
            problems.len(),
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n  ")
        )
    })?;
    println!(
        "{}: ok ({} models, {} engines)",
        path.display(),
        config.model_count(),
        config.engine_count()
    );
    Ok(())
}

/// `switchyard config schema`.
pub(crate) fn schema() -> anyhow::Result<()> {
    println!(
        "{}",
        serde_json::to_string_pretty(&RouterConfig::json_schema())?
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use router_policy::AdmissionLimits;

    use super::*;

    #[derive(Debug, Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn fleet(flags: &[&str]) -> anyhow::Result<RouterConfig> {
        let serve = Serve::try_parse_from(std::iter::once("serve").chain(flags.iter().copied()))?;
        config_from(&serve.args, None)
    }

    fn capped(policy: &PolicyConfig) -> (&'static str, Option<u64>) {
        (policy.type_name(), policy.admission().max_inflight_requests)
    }

    #[test]
    fn a_cap_without_a_policy_keeps_each_roles_builtin_policy() {
        let config = fleet(&[
            "--model",
            "m",
            "--worker-urls",
            "http://a:1",
            "--max-in-flight",
            "8",
        ])
        .unwrap();
        let policies = &config.policies;
        assert_eq!(
            capped(policies.plain.as_ref().unwrap()),
            ("round_robin", Some(8)),
            "plain groups stay round-robin when only a cap is given"
        );
        for pd in [&policies.prefill, &policies.decode] {
            assert_eq!(capped(pd.as_ref().unwrap()), ("power_of_two", Some(8)));
        }
        let uncapped =
            fleet(&["--model", "m", "--worker-urls", "http://a:1", "http://b:1"]).unwrap();
        assert_eq!(uncapped.policies, RolePolicies::default());
        let ids: Vec<_> = uncapped.models[0]
            .engines
            .iter()
            .map(|e| e.id.as_str())
            .collect();
        assert_eq!(
            ids,
            ["worker-0", "worker-1"],
            "named after the flag, as peer routers name them"
        );
    }

    #[test]
    fn fleet_flags_describe_one_model_of_typed_engines() {
        let config = fleet(&[
            "--model",
            "m",
            "--prefill",
            "http://p:1/",
            "9000",
            "--decode",
            "http://d:1",
            "--policy",
            "load_based",
            "--decode-policy",
            "random",
            "--host",
            "127.0.0.1",
            "--port",
            "9",
            "--admin-token",
            "secret",
        ])
        .unwrap();
        assert_eq!(config.listen, "127.0.0.1:9".parse().unwrap());
        assert_eq!(
            config.admin.token.as_ref().map(Secret::expose),
            Some("secret")
        );
        let model = &config.models[0];
        assert_eq!(model.id, "m");
        let engines: Vec<_> = model
            .engines
            .iter()
            .map(|e| (e.id.as_str(), e.url.as_str(), e.role, e.bootstrap_port))
            .collect();
        assert_eq!(
            engines,
            [
                (
                    "prefill-0",
                    "http://p:1",
                    Some(EngineRole::Prefill),
                    Some(9000)
                ),
                ("decode-0", "http://d:1", Some(EngineRole::Decode), None),
            ]
        );
        let policies = &config.policies;
        assert_eq!(policies.prefill.as_ref().unwrap().type_name(), "load_based");
        assert_eq!(policies.decode.as_ref().unwrap().type_name(), "random");
        assert_eq!(
            *policies.decode.as_ref().unwrap().admission(),
            AdmissionLimits::default()
        );
    }

    #[test]
    fn the_admin_token_comes_from_the_flag_else_the_file_else_the_environment() {
        let flags = |extra: &[&str]| {
            let mut all = vec!["serve", "--model", "m", "--worker-urls", "http://a:1"];
            all.extend_from_slice(extra);
            Serve::try_parse_from(all).unwrap().args
        };
        let token = |config: RouterConfig| config.admin.token.map(|t| t.expose().to_owned());
        assert_eq!(token(config_from(&flags(&[]), None).unwrap()), None, "off");
        assert_eq!(
            token(config_from(&flags(&[]), Some("env".into())).unwrap()).as_deref(),
            Some("env")
        );
        assert_eq!(
            token(config_from(&flags(&[]), Some(String::new())).unwrap()),
            None,
            "an empty variable sets nothing"
        );
        assert_eq!(
            token(config_from(&flags(&["--admin-token", "flag"]), Some("env".into())).unwrap())
                .as_deref(),
            Some("flag")
        );
    }

    /// What `config_from` logs for `flags`.
    fn logged(flags: &[&str]) -> String {
        use std::sync::{Arc, Mutex};
        #[derive(Clone)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines(Arc::default());
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let mut all = vec!["serve", "--model", "m", "--worker-urls", "http://a:1"];
        all.extend_from_slice(flags);
        let args = Serve::try_parse_from(all).unwrap().args;
        tracing::subscriber::with_default(subscriber, || config_from(&args, None).unwrap());
        String::from_utf8(lines.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn the_admin_token_flag_is_warned_of_and_never_printed() {
        let warned = logged(&["--admin-token", "s3cret"]);
        assert!(
            warned.contains("WARN") && warned.contains("--admin-token is for tests"),
            "{warned}"
        );
        assert!(!warned.contains("s3cret"), "{warned}");
        assert_eq!(logged(&[]), "", "no flag, no warning");
        let args = Serve::try_parse_from(["serve", "--admin-token", "s3cret"])
            .unwrap()
            .args;
        let printed = format!("{args:?}");
        assert!(!printed.contains("s3cret"), "{printed}");
    }

    #[test]
    fn the_settle_interval_is_bounded_and_half_a_second_by_default() {
        let parse = |flags: &[&str]| {
            let flags = ["serve", "--config", "x.yaml"]
                .into_iter()
                .chain(flags.iter().copied());
            Serve::try_parse_from(flags).map(|serve| serve.args.config_settle_ms)
        };
        assert_eq!(parse(&[]).unwrap(), 500);
        assert_eq!(parse(&["--config-settle-ms", "60000"]).unwrap(), 60_000);
        for outside in ["9", "60001"] {
            let error = parse(&["--config-settle-ms", outside])
                .unwrap_err()
                .to_string();
            assert!(error.contains("10..=60000"), "{error}");
        }
    }

    #[test]
    fn fleet_flags_refuse_what_they_cannot_describe() {
        let error = |flags: &[&str]| fleet(flags).unwrap_err().to_string();
        assert_eq!(
            error(&["--worker-urls", "http://a:1"]),
            "--model is required without --config"
        );
        assert_eq!(
            error(&["--model", "m"]),
            "no engines: pass --worker-urls, or --prefill and --decode, or --config FILE"
        );
        assert_eq!(
            error(&["--config", "x.yaml", "--model", "m"]),
            "use either --config or the fleet flags (--model, --worker-urls, --prefill, --decode, --tokenizer)"
        );
        assert_eq!(
            error(&[
                "--model",
                "m",
                "--worker-urls",
                "http://a:1",
                "--filter",
                "overloaded"
            ]),
            "--filter overloaded needs --max-in-flight N"
        );
        assert!(
            error(&[
                "--model",
                "m",
                "--worker-urls",
                "http://a:1",
                "--filter",
                "prefix-cache"
            ])
            .starts_with("--filter prefix_cache was removed"),
        );
        assert!(
            error(&[
                "--model",
                "m",
                "--worker-urls",
                "http://a:1",
                "--policy",
                "fastest"
            ])
            .starts_with("--policy fastest: unknown variant `fastest`"),
        );
    }

    #[test]
    fn prefill_flags_pair_urls_with_optional_bootstrap_ports() {
        let values = ["http://p1:1", "9000", "http://p2:1"].map(String::from);
        assert_eq!(
            prefill_pairs(&values).unwrap(),
            [
                ("http://p1:1".to_owned(), Some(9000)),
                ("http://p2:1".to_owned(), None)
            ]
        );
        assert!(prefill_pairs(&["9000".to_owned()]).is_err());
    }
}
