//! `cargo xtask tidy`: the architecture invariants of ARCHITECTURE.md and the code
//! hygiene rules, checked mechanically.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::cargo;

/// The router's layers, bottom first: a crate may depend only on crates below it.
const LAYERS: &[&str] = &[
    "router-state",
    "router-policy",
    "router-buckets",
    "router-http",
    "switchyard",
];

/// The simulated engine is the other side of the wire and must not share router code.
const SIMULATOR: &str = "engine-sim";

/// HTTP and server stacks; nothing below router-http may use them.
const HTTP_STACK: &[&str] = &["axum", "hyper", "hyper-util", "tower-http", "reqwest", "h2"];

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
    let output = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: Metadata =
        serde_json::from_slice(&output.stdout).context("parsing cargo metadata")?;
    let mut problems = check_dependencies(&metadata.packages);
    for package in &metadata.packages {
        let manifest = fs::read_to_string(&package.manifest_path)?;
        if !manifest.contains("[lints]\nworkspace = true") {
            problems.push(format!(
                "{}: Cargo.toml must inherit the workspace lints",
                package.name
            ));
        }
    }
    for dir in ["crates", "bins", "xtask", "benches"] {
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

/// Dependency direction: layers point down, the simulator shares nothing with the
/// router, and no crate below router-http uses an HTTP stack.
fn check_dependencies(packages: &[Package]) -> Vec<String> {
    let layer = |name: &str| LAYERS.iter().position(|l| *l == name);
    let http = layer("router-http").expect("router-http is a layer");
    let mut problems = Vec::new();
    for package in packages {
        let own = layer(&package.name);
        for dep in &package.dependencies {
            if package.name == SIMULATOR && layer(&dep.name).is_some() {
                problems.push(format!(
                    "{SIMULATOR} depends on {}: the simulated engine is the other side of the wire \
                     and must not share router code",
                    dep.name
                ));
            }
            if dep.is_dev() {
                continue;
            }
            match (own, layer(&dep.name)) {
                (Some(own), Some(theirs)) if theirs >= own => problems.push(format!(
                    "{} depends on {}: dependencies flow downward only ({})",
                    package.name,
                    dep.name,
                    LAYERS.join(" <- ")
                )),
                _ => {}
            }
            let below_http = own.is_some_and(|o| o < http);
            if below_http && HTTP_STACK.contains(&dep.name.as_str()) {
                problems.push(format!(
                    "{} depends on {}: nothing below router-http may use an HTTP stack",
                    package.name, dep.name
                ));
            }
            if below_http && dep.name == SIMULATOR {
                problems.push(format!(
                    "{} depends on {SIMULATOR}: only tests and the binary may",
                    package.name
                ));
            }
        }
    }
    problems
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
        assert_eq!(
            check_dependencies(&workspace(package("xtask", &[]))),
            Vec::<String>::new()
        );
    }

    #[test]
    fn an_upward_dependency_fails() {
        let problems = check_dependencies(&workspace(package(
            "router-state",
            &[("router-buckets", None)],
        )));
        assert_eq!(
            problems,
            [
                "router-state depends on router-buckets: dependencies flow downward only \
              (router-state <- router-policy <- router-buckets <- router-http <- switchyard)"
            ]
        );
        let sideways = check_dependencies(&workspace(package(
            "router-policy",
            &[("router-policy", Some("build"))],
        )));
        assert_eq!(
            sideways.len(),
            1,
            "a crate may not depend on its own layer: {sideways:?}"
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
    fn http_stacks_and_the_simulator_stay_above_the_selection_core() {
        let problems = check_dependencies(&workspace(package(
            "router-buckets",
            &[("axum", None), (SIMULATOR, None)],
        )));
        assert_eq!(
            problems,
            [
                "router-buckets depends on axum: nothing below router-http may use an HTTP stack",
                "router-buckets depends on engine-sim: only tests and the binary may",
            ]
        );
        assert!(
            check_dependencies(&workspace(package("router-http", &[("axum", None)]))).is_empty()
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
