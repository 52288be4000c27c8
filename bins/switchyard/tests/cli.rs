//! The `switchyard config` commands as an operator runs them.

use std::path::Path;
use std::process::{Command, Output};

fn switchyard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/examples/router.yaml")
        .display()
        .to_string()
}

#[test]
fn config_check_accepts_the_documented_example() {
    let path = example();
    let out = switchyard(&["config", "check", &path]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!("{path}: ok (2 models, 4 engines)\n")
    );
}

#[test]
fn config_check_names_every_problem_with_its_path_and_fails() {
    let dir = std::env::temp_dir().join(format!("switchyard-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "models:\n  - id: m\n    block_size: 0\n    engines:\n      - {id: A, url: 'ftp://a:1', role: plain}\n",
    )
    .unwrap();
    let out = switchyard(&["config", "check", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("2 problem(s)"), "{stderr}");
    assert!(
        stderr.contains("models[0].block_size: must be at least 1"),
        "{stderr}"
    );
    assert!(
        stderr.contains("models[0].engines[0].url: must start with http://"),
        "{stderr}"
    );
    let tokenizer = dir.join("tokenizer.yaml");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        &tokenizer,
        "models:\n  - id: m\n    tokenizer: /no/such/tokenizer.json\n    engines: [{id: A, url: 'http://a:1', role: plain}]\n",
    )
    .unwrap();
    let out = switchyard(&["config", "check", tokenizer.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("models[0].tokenizer: /no/such/tokenizer.json: "),
        "the tokenizer is loaded as startup loads it: {}",
        text(&out.stderr)
    );
    let missing = switchyard(&["config", "check", "/no/such/router.yaml"]);
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains("reading /no/such/router.yaml"),
        "{}",
        text(&missing.stderr)
    );
}

#[test]
fn config_schema_prints_the_configuration_schema() {
    let out = switchyard(&["config", "schema"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(schema["title"], "RouterConfig");
    assert_eq!(schema["required"], serde_json::json!(["models"]));
    for field in [
        "listen", "models", "timeouts", "health", "admin", "affinity",
    ] {
        assert!(
            schema["properties"].get(field).is_some(),
            "the schema has {field}"
        );
    }
}

#[test]
fn removed_flags_of_earlier_routers_name_their_replacement() {
    let out = switchyard(&["serve", "--stable-pair"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "error: --stable-pair was removed: bucket-first selection always takes both PD \
         engines from the same bucket\n"
    );
}
