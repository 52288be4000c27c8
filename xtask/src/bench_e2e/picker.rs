//! `--picker`: the endpoint picker measured beside the proxy, on the same engine and
//! loads: Envoy alone in front of the engine (the gateway's own cost), and Envoy with
//! Switchyard as its endpoint picker, both running the sample configuration,
//! deploy/envoy/envoy.yaml (without its `ext_proc` filter for Envoy alone). The
//! picker's CPU is counted with Envoy's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context;
use serde_json::{Value, json};

use crate::processes::Target;

/// The name Envoy alone is reported under.
pub(crate) const ENVOY: &str = "envoy";
/// The name Envoy with the picker is reported under.
pub(crate) const PICKER: &str = "envoy + switchyard picker";

/// The sample configuration with a loopback listener on `port`, the engine at
/// `engine` (`host:port`) as the pool, and the picker on `picker`, or no
/// `ext_proc` filter without one.
fn configuration(
    root: &Path,
    port: u16,
    engine: &str,
    picker: Option<u16>,
) -> anyhow::Result<Value> {
    let sample = root.join("deploy/envoy/envoy.yaml");
    let text = std::fs::read_to_string(&sample).context("reading deploy/envoy/envoy.yaml")?;
    let mut config: Value = serde_norway::from_str(&text).context("the sample is YAML")?;
    let address =
        |host: &str, port: u16| json!({"socket_address": {"address": host, "port_value": port}});
    let (engine_host, engine_port) = engine.rsplit_once(':').context("an engine host:port")?;
    let engine_port: u16 = engine_port.parse()?;
    let resources = &mut config["static_resources"];
    let listener = &mut resources["listeners"][0];
    listener["address"] = address("127.0.0.1", port);
    let filters = listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
        .as_array_mut()
        .context("the HTTP filters")?;
    if picker.is_none() {
        filters.retain(|f| f["name"] != "envoy.filters.http.ext_proc");
    }
    for cluster in resources["clusters"]
        .as_array_mut()
        .context("the clusters")?
    {
        let endpoint = match (cluster["name"].as_str(), picker) {
            (Some("picker"), Some(picker)) => address("127.0.0.1", picker),
            (Some("pool"), _) => address(engine_host, engine_port),
            _ => continue,
        };
        cluster["type"] = "STATIC".into();
        cluster["load_assignment"]["endpoints"] =
            json!([{"lb_endpoints": [{"endpoint": {"address": endpoint}}]}]);
    }
    config["admin"]["address"] = address("127.0.0.1", 0);
    Ok(config)
}

/// Starts Envoy on `port` in front of `engine`, with the picker on `picker` if any.
pub(crate) fn envoy(
    root: &Path,
    name: &str,
    port: u16,
    engine: &str,
    picker: Option<u16>,
) -> anyhow::Result<(Target, PathBuf)> {
    let config = configuration(root, port, engine, picker)?;
    let file = std::env::temp_dir().join(format!(
        "switchyard-bench-envoy-{}-{port}.json",
        std::process::id()
    ));
    std::fs::write(&file, config.to_string())?;
    let envoy = crate::python::cache_dir(root).join("venv/bin/envoy");
    let mut command = Command::new(envoy);
    command
        .arg("-c")
        .arg(&file)
        .args(["--use-dynamic-base-id", "--log-level", "error"])
        .stdin(Stdio::null());
    Ok((super::start(command, name, port)?, file))
}

/// The configuration `config` (a bounded one) with the picker on `port`.
pub(crate) fn picker_config(config: &Path, port: u16) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(config)?;
    let file = config.with_extension("picker.yaml");
    std::fs::write(
        &file,
        format!("{text}picker: {{listen: 127.0.0.1:{port}}}\n"),
    )?;
    Ok(file)
}
