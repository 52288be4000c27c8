//! `cargo xtask tidy`: the architecture invariants of ARCHITECTURE.md and the code
//! hygiene rules, checked mechanically.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::cargo_metadata;

/// Each router crate and the router crates it may depend on (dev-dependencies may
/// reach further, for tests). The selection core (state, policy, buckets) and the
/// engine side (upstream, fleet) meet only in the HTTP crate and the binary.
const ALLOWED: &[(&str, &[&str])] = &[
    ("router-state", &[]),
    ("router-policy", &["router-state"]),
    ("router-buckets", &["router-state", "router-policy"]),
    ("router-upstream", &[]),
    ("router-fleet", &["router-state", "router-upstream"]),
    ("router-tokenize", &[]),
    ("router-flow", &[]),
    (
        "router-config",
        &[
            "router-state",
            "router-policy",
            "router-buckets",
            "router-upstream",
        ],
    ),
    (
        "router-http",
        &[
            "router-state",
            "router-policy",
            "router-buckets",
            "router-upstream",
            "router-fleet",
            "router-tokenize",
            "router-config",
            "router-flow",
        ],
    ),
    (
        "router-replay",
        &[
            "router-state",
            "router-policy",
            "router-buckets",
            "router-config",
        ],
    ),
    (
        "switchyard",
        &[
            "router-state",
            "router-policy",
            "router-buckets",
            "router-upstream",
            "router-fleet",
            "router-tokenize",
            "router-config",
            "router-http",
            "router-replay",
            "router-flow",
        ],
    ),
];

/// Crates that never reach an HTTP server stack, a high-level HTTP client or an
/// OTLP exporter, directly or through any other crate (as `cargo tree -e normal`
/// resolves each on its own): the selection core, the engine client, the
/// tokenizer, the configuration and the replay.
const WITHOUT_SERVER_STACK: &[&str] = &[
    "router-state",
    "router-policy",
    "router-buckets",
    "router-upstream",
    "router-tokenize",
    "router-config",
    "router-replay",
    "router-flow",
];

/// The selection core as an embedder builds it, without its default features: it
/// reaches no networking at all, so a gateway can take policies and buckets alone.
const WITHOUT_NETWORK: &[&str] = &[
    "router-state",
    "router-policy",
    "router-buckets",
    "router-flow",
];

/// What [`WITHOUT_NETWORK`] crates never reach besides [`HTTP_STACK`]: sockets, and
/// the clients of feeds, stores and clusters.
const NETWORK: &[&str] = &[
    "switchyard-zeromq",
    "redis",
    "kube",
    "k8s-openapi",
    "socket2",
    "mio",
];

/// What [`WITHOUT_SERVER_STACK`] crates never reach besides [`HTTP_STACK`]: the span
/// exporter and its SDK.
const OTLP_EXPORTER: &[&str] = &["opentelemetry-otlp", "opentelemetry_sdk"];

/// The simulated engine is the other side of the wire and must not share router code.
const SIMULATOR: &str = "engine-sim";
/// Beside tests, what may depend on the simulated engine: the binary, and the replay,
/// which runs the selection code against its engine model.
const SIMULATOR_USERS: &[&str] = &["switchyard", "router-replay"];

/// HTTP server stacks and high-level clients: only the HTTP crate and the binary use
/// them (the upstream client speaks HTTP/1.1 itself).
const HTTP_STACK: &[&str] = &[
    "axum",
    "hyper",
    "hyper-util",
    "tower",
    "tower-http",
    "reqwest",
    "h2",
];
/// Where HTTP stacks may be used.
const HTTP_USERS: &[&str] = &["router-http", "switchyard"];

/// Cluster and store clients: they arrive behind the fleet and state seams, never in
/// the HTTP crate.
const CLUSTER_CLIENTS: &[&str] = &["kube", "kube-runtime", "k8s-openapi", "redis"];

/// Longest source file, in lines, that still reads in one sitting.
const MAX_FILE_LINES: usize = 800;

#[derive(Debug, Deserialize)]
struct Metadata {
    packages: Vec<Package>,
}

#[derive(Debug, Deserialize)]
struct Package {
    name: String,
    manifest_path: PathBuf,
    dependencies: Vec<Dependency>,
}

#[derive(Debug, Deserialize)]
struct Dependency {
    name: String,
    /// `None` for normal dependencies, `"dev"` or `"build"` otherwise.
    kind: Option<String>,
}

impl Dependency {
    fn is_dev(&self) -> bool {
        self.kind.as_deref() == Some("dev")
    }
}

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    let metadata: Metadata =
        serde_json::from_slice(&cargo_metadata()?).context("parsing cargo metadata")?;
    let mut problems = check_dependencies(&metadata.packages);
    for krate in WITHOUT_SERVER_STACK {
        problems.extend(check_reach(krate, &reached(krate, &[])?));
    }
    for krate in WITHOUT_NETWORK {
        let reached = reached(krate, &["--no-default-features"])?;
        problems.extend(check_network(krate, &reached));
    }
    for package in &metadata.packages {
        let manifest = fs::read_to_string(&package.manifest_path)?;
        if !manifest.contains("[lints]\nworkspace = true") {
            problems.push(format!(
                "{}: Cargo.toml must inherit the workspace lints",
                package.name
            ));
        }
    }
    for dir in ["crates", "bins", "xtask", "benches", "tests", "examples"] {
        for file in rust_files(&root.join(dir))? {
            let text = fs::read_to_string(&file)?;
            let relative = file
                .strip_prefix(root)
                .unwrap_or(&file)
                .display()
                .to_string();
            problems.extend(check_source(&relative, &text));
        }
    }
    if problems.is_empty() {
        eprintln!("    tidy passed");
        return Ok(());
    }
    for p in &problems {
        eprintln!("tidy: {p}");
    }
    bail!("tidy found {} problem(s)", problems.len())
}

/// Dependency direction: each router crate depends only on the router crates it is
/// allowed, the simulator shares nothing with the router, HTTP stacks stay in the
/// HTTP crate and the binary, and cluster or store clients stay out of the HTTP crate.
fn check_dependencies(packages: &[Package]) -> Vec<String> {
    let allowed = |name: &str| ALLOWED.iter().find(|(n, _)| *n == name).map(|(_, a)| *a);
    let mut problems = Vec::new();
    for package in packages {
        let own = allowed(&package.name);
        for dep in &package.dependencies {
            let router_dep = allowed(&dep.name).is_some();
            if package.name == SIMULATOR && router_dep {
                problems.push(format!(
                    "{SIMULATOR} depends on {}: the simulated engine is the other side of the wire \
                     and must not share router code",
                    dep.name
                ));
            }
            if dep.is_dev() {
                continue;
            }
            let Some(own) = own else {
                continue;
            };
            if router_dep && !own.contains(&dep.name.as_str()) {
                problems.push(format!(
                    "{} depends on {}: it may depend only on {}",
                    package.name,
                    dep.name,
                    if own.is_empty() {
                        "no router crate".to_owned()
                    } else {
                        own.join(", ")
                    }
                ));
            }
            if HTTP_STACK.contains(&dep.name.as_str())
                && !HTTP_USERS.contains(&package.name.as_str())
            {
                problems.push(format!(
                    "{} depends on {}: only {} may use an HTTP stack",
                    package.name,
                    dep.name,
                    HTTP_USERS.join(" and ")
                ));
            }
            if package.name == "router-http" && CLUSTER_CLIENTS.contains(&dep.name.as_str()) {
                problems.push(format!(
                    "router-http depends on {}: cluster and store clients belong behind the fleet \
                     and state seams",
                    dep.name
                ));
            }
            if dep.name == SIMULATOR && !SIMULATOR_USERS.contains(&package.name.as_str()) {
                problems.push(format!(
                    "{} depends on {SIMULATOR}: only tests, {} may",
                    package.name,
                    SIMULATOR_USERS.join(" and ")
                ));
            }
        }
    }
    problems
}

/// Every package `krate` reaches through normal dependencies, resolved with its own
/// features only (and the feature flags in `features`).
fn reached(krate: &str, features: &[&str]) -> anyhow::Result<Vec<String>> {
    let output = crate::cargo()
        .args(["tree", "--locked", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "-p", krate])
        .args(features)
        .output()
        .context("running cargo tree")?;
    if !output.status.success() {
        bail!(
            "cargo tree -p {krate} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

/// One problem for each part of the server stack `krate` reaches.
fn check_reach(krate: &str, reached: &[String]) -> Vec<String> {
    HTTP_STACK
        .iter()
        .chain(OTLP_EXPORTER)
        .filter(|stack| reached.iter().any(|name| name == *stack))
        .map(|stack| {
            format!(
                "{krate} reaches {stack}: it must build without a server stack \
                 (`cargo tree -p {krate} -e normal -i {stack}` shows through which crate)"
            )
        })
        .collect()
}

/// One problem for each networking crate `krate`, built without its default
/// features, reaches.
fn check_network(krate: &str, reached: &[String]) -> Vec<String> {
    NETWORK
        .iter()
        .chain(HTTP_STACK)
        .filter(|net| reached.iter().any(|name| name == *net))
        .map(|net| {
            format!(
                "{krate} without default features reaches {net}: the selection core \
                 builds with no networking (`cargo tree -p {krate} --no-default-features \
                 -e normal -i {net}` shows through which crate)"
            )
        })
        .collect()
}

/// Hygiene of one source file.
fn check_source(path: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if path.starts_with("crates/") && path.ends_with("/src/lib.rs") && !text.starts_with("//!") {
        problems.push(format!(
            "{path}: lib.rs must open with the crate's purpose (//! docs)"
        ));
    }
    let lines = text.lines().count();
    if lines > MAX_FILE_LINES {
        problems.push(format!(
            "{path}: {lines} lines; split it below {MAX_FILE_LINES}"
        ));
    }
    let banned = [
        (concat!("#[", "ignore"), "tests are never ignored"),
        (
            concat!("#[", "should_panic"),
            "assert the error value instead of a panic",
        ),
    ];
    for (number, line) in text.lines().enumerate() {
        for (pattern, why) in banned {
            if line.contains(pattern) {
                problems.push(format!("{path}:{}: `{pattern}`: {why}", number + 1));
            }
        }
        for marker in [concat!("TO", "DO"), concat!("FIX", "ME")] {
            if let Some(at) = line.find(marker)
                && !line[at + marker.len()..].starts_with("(#")
            {
                problems.push(format!(
                    "{path}:{}: {marker} without an issue reference, e.g. {marker}(#12)",
                    number + 1
                ));
            }
        }
    }
    problems
}

fn rust_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    if !dir.exists() {
        return Ok(files);
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn package(name: &str, deps: &[(&str, Option<&str>)]) -> Package {
        Package {
            name: name.into(),
            manifest_path: PathBuf::new(),
            dependencies: deps
                .iter()
                .map(|(n, k)| Dependency {
                    name: (*n).into(),
                    kind: k.map(Into::into),
                })
                .collect(),
        }
    }

    fn workspace(extra: Package) -> Vec<Package> {
        vec![
            package("router-state", &[("tokio", None)]),
            package("router-policy", &[("router-state", None)]),
            package(
                "router-buckets",
                &[("router-state", None), ("router-policy", None)],
            ),
            package("switchyard", &[("router-buckets", None), (SIMULATOR, None)]),
            package(SIMULATOR, &[("tokio", None)]),
            extra,
        ]
    }

    #[test]
    fn the_real_layering_passes() {
        let metadata: Metadata =
            serde_json::from_slice(&cargo_metadata().expect("cargo metadata runs"))
                .expect("cargo metadata parses");
        let layered = ALLOWED.iter().map(|(name, _)| *name);
        for crate_name in layered.chain([SIMULATOR]) {
            assert!(
                metadata.packages.iter().any(|p| p.name == crate_name),
                "{crate_name} is in the workspace's graph"
            );
        }
        assert_eq!(check_dependencies(&metadata.packages), Vec::<String>::new());
    }

    #[test]
    fn a_dependency_outside_the_allowed_set_fails() {
        let problems = check_dependencies(&workspace(package(
            "router-state",
            &[("router-buckets", None)],
        )));
        assert_eq!(
            problems,
            ["router-state depends on router-buckets: it may depend only on no router crate"]
        );
        let sideways = check_dependencies(&workspace(package(
            "router-upstream",
            &[("router-policy", None), ("router-fleet", Some("build"))],
        )));
        assert_eq!(
            sideways,
            [
                "router-upstream depends on router-policy: it may depend only on no router crate",
                "router-upstream depends on router-fleet: it may depend only on no router crate",
            ]
        );
        let itself = check_dependencies(&workspace(package(
            "router-policy",
            &[("router-policy", Some("build"))],
        )));
        assert_eq!(
            itself,
            ["router-policy depends on router-policy: it may depend only on router-state"],
            "a crate may not depend on itself"
        );
        let fleet = check_dependencies(&workspace(package(
            "router-fleet",
            &[("router-http", None), ("router-buckets", None)],
        )));
        assert_eq!(
            fleet.len(),
            2,
            "the fleet imports no HTTP or selection crate: {fleet:?}"
        );
    }

    #[test]
    fn dev_dependencies_may_reach_up_but_the_simulator_may_not() {
        let tests_only = package("router-policy", &[("router-buckets", Some("dev"))]);
        assert!(check_dependencies(&workspace(tests_only)).is_empty());
        let problems = check_dependencies(&workspace(package(
            SIMULATOR,
            &[("router-state", Some("dev"))],
        )));
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].starts_with("engine-sim depends on router-state"),
            "{problems:?}"
        );
    }

    #[test]
    fn http_stacks_cluster_clients_and_the_simulator_stay_where_they_belong() {
        let problems = check_dependencies(&workspace(package(
            "router-buckets",
            &[("axum", None), (SIMULATOR, None)],
        )));
        assert_eq!(
            problems,
            [
                "router-buckets depends on axum: only router-http and switchyard may use an HTTP stack",
                "router-buckets depends on engine-sim: only tests, switchyard and router-replay may",
            ]
        );
        let upstream =
            check_dependencies(&workspace(package("router-upstream", &[("hyper", None)])));
        assert_eq!(upstream.len(), 1, "{upstream:?}");
        assert!(
            check_dependencies(&workspace(package("router-http", &[("axum", None)]))).is_empty()
        );
        assert_eq!(
            check_dependencies(&workspace(package("router-http", &[("kube", None)]))),
            [
                "router-http depends on kube: cluster and store clients belong behind the fleet \
                 and state seams"
            ]
        );
        assert!(
            check_dependencies(&workspace(package("router-fleet", &[("kube", None)]))).is_empty()
        );
    }

    #[test]
    fn the_real_crates_reach_no_server_stack() {
        for krate in WITHOUT_SERVER_STACK {
            let reached = reached(krate, &[]).expect("cargo tree runs");
            assert!(reached.iter().any(|name| name == krate), "{reached:?}");
            assert_eq!(check_reach(krate, &reached), Vec::<String>::new());
        }
    }

    #[test]
    fn the_selection_core_reaches_no_network_without_its_defaults() {
        for krate in WITHOUT_NETWORK {
            let reached = reached(krate, &["--no-default-features"]).expect("cargo tree runs");
            assert!(reached.iter().any(|name| name == krate), "{reached:?}");
            assert_eq!(check_network(krate, &reached), Vec::<String>::new());
        }
        let with_defaults = reached("router-state", &[]).expect("cargo tree runs");
        let problems = check_network("router-state", &with_defaults);
        for net in ["switchyard-zeromq", "redis"] {
            let says = format!("reaches {net}:");
            assert!(problems.iter().any(|p| p.contains(&says)), "{problems:?}");
        }
    }

    #[test]
    fn a_server_stack_reached_through_another_crate_fails() {
        let reached: Vec<String> = [
            "router-replay",
            "engine-sim",
            "axum",
            "hyper",
            "tokio",
            "opentelemetry-otlp",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            check_reach("router-replay", &reached),
            [
                "router-replay reaches axum: it must build without a server stack \
                 (`cargo tree -p router-replay -e normal -i axum` shows through which crate)",
                "router-replay reaches hyper: it must build without a server stack \
                 (`cargo tree -p router-replay -e normal -i hyper` shows through which crate)",
                "router-replay reaches opentelemetry-otlp: it must build without a server stack \
                 (`cargo tree -p router-replay -e normal -i opentelemetry-otlp` shows through which crate)",
            ]
        );
    }

    #[test]
    fn source_hygiene() {
        let ignored = format!("#[test]\n{}]\nfn t() {{}}\n", concat!("#[", "ignore"));
        assert_eq!(check_source("crates/a/src/x.rs", &ignored).len(), 1);
        let todo = format!(
            "// {}: later\n// {}(#7): tracked\n",
            concat!("TO", "DO"),
            concat!("TO", "DO")
        );
        let problems = check_source("crates/a/src/x.rs", &todo);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("crates/a/src/x.rs:1:"));
        assert_eq!(
            check_source("crates/a/src/lib.rs", "use x;\n").len(),
            1,
            "lib.rs needs crate docs"
        );
        assert!(check_source("crates/a/src/lib.rs", "//! Purpose.\n").is_empty());
        let long = "//!\n".repeat(MAX_FILE_LINES + 1);
        assert_eq!(check_source("crates/a/src/lib.rs", &long).len(), 1);
    }
}
