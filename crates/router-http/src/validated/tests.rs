use super::*;

const MINIMAL: &str = r#"
models:
  - id: chat-model
    engines:
      - {id: A1, url: "http://127.0.0.1:31011", role: plain}
"#;

fn validate(yaml: &str) -> Result<ValidatedConfig, Vec<String>> {
    let config = RouterConfig::from_yaml(yaml).map_err(|e| vec![e.to_string()])?;
    ValidatedConfig::validate(config)
        .map_err(|errors| errors.iter().map(ToString::to_string).collect())
}

#[test]
fn the_brief_example_validates() {
    let validated = validate(include_str!("../../../../docs/examples/router.yaml")).unwrap();
    assert_eq!((validated.model_count(), validated.engine_count()), (2, 4));
}

#[test]
fn the_admin_token_is_checked_after_the_fields_and_before_the_models() {
    let errors = validate(
        "timeouts: {connect_ms: 0}\nadmin: {token: ''}\nmodels: [{id: m, block_size: 0, engines: [{id: A, url: 'http://a:1', role: plain}], buckets: [{id: b, groups: {plain: {engine_ids: [Z]}}}]}]\n",
    )
    .unwrap_err();
    assert_eq!(
        errors,
        [
            "timeouts.connect_ms: must be at least 1",
            "models[0].block_size: must be at least 1",
            "admin.token: the token must not be empty; omit it to keep the admin API off",
            "models[0].buckets[0].groups.plain.engine_ids[0]: unknown engine \"Z\"",
        ]
    );
}

#[test]
fn a_redis_url_is_never_printed_and_rendezvous_keeps_no_store() {
    let validated = validate(&format!(
        "{MINIMAL}affinity: {{backend: redis, redis: {{url: 'redis://user:hunter2@10.0.0.9:6379/2'}}}}\n"
    ))
    .expect("valid");
    assert!(!format!("{validated:?}").contains("hunter2"));
    assert!(validated.affinity.is_some());
    let rendezvous =
        validate(&format!("{MINIMAL}affinity: {{backend: rendezvous}}\n")).expect("valid");
    assert!(rendezvous.affinity.is_none(), "rendezvous keeps no store");
}

#[test]
fn no_token_is_printed() {
    let tokenizer = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/tokenizer-tiny/tokenizer.json"
    );
    let validated = validate(&format!(
        "models:\n  - {{id: m, tokenizer: {tokenizer}, engines: [{{id: A, url: 'http://a:1', role: plain}}], policies: {{plain: {{type: cache_aware}}}}}}\nadmin: {{token: admin-s3cret}}\nprefix_indexer: {{url: 'http://10.0.0.5:30100', token: indexer-s3cret}}\n"
    ))
    .expect("valid");
    let printed = format!("{validated:?}");
    assert!(
        printed.contains("RemoteCacheSource"),
        "the indexer's client is printed: {printed}"
    );
    assert!(
        !printed.contains("admin-s3cret") && !printed.contains("indexer-s3cret"),
        "{printed}"
    );
}

#[test]
fn each_model_has_a_tokenizer_of_its_own_and_keeps_it_on_reload() {
    // A tokenizer's prefix cache is its model's (`limits.tokenize_cache_bytes` is per
    // model): two models naming one file get one each, and a reload keeps a model's
    // own, not another's that names the file.
    let tokenizer = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/tokenizer-tiny/tokenizer.json"
    );
    let model = |id: &str| {
        format!(
            "  - {{id: {id}, tokenizer: {tokenizer}, engines: [{{id: E{id}, url: 'http://{id}:1', role: plain}}]}}\n"
        )
    };
    let yaml = format!("models:\n{}{}", model("a"), model("b"));
    let first = validate(&yaml).unwrap();
    let of =
        |config: &ValidatedConfig, m: usize| config.models[m].selection.tokenizer.clone().unwrap();
    assert!(!Arc::ptr_eq(&of(&first, 0), &of(&first, 1)));
    let mut shared = SharedState::new(&RouterConfig::from_yaml(&yaml).unwrap());
    shared.tokenizers = crate::app::Configured::of(&first).tokenizers;
    let again = ValidatedConfig::around(RouterConfig::from_yaml(&yaml).unwrap(), shared).unwrap();
    assert!(Arc::ptr_eq(&of(&first, 0), &of(&again, 0)));
    assert!(Arc::ptr_eq(&of(&first, 1), &of(&again, 1)));
    let swapped = format!("models:\n{}{}", model("b"), model("a"));
    let mut shared = SharedState::new(&RouterConfig::from_yaml(&swapped).unwrap());
    shared.tokenizers = crate::app::Configured::of(&first).tokenizers;
    let swapped =
        ValidatedConfig::around(RouterConfig::from_yaml(&swapped).unwrap(), shared).unwrap();
    assert!(
        Arc::ptr_eq(&of(&first, 0), &of(&swapped, 1)),
        "a's own, wherever it stands"
    );
}

#[test]
fn a_replay_builds_the_selection_the_router_builds() {
    // Every bucket kind, several policies with their caps, session affinity, a
    // cache-aware group with its index, an engine whose role introspection tells.
    let yaml = r#"
policies: {plain: {type: power_of_two, seed: 3, admission: {max_inflight_requests: 9}}}
affinity: {idle_timeout_ms: 5000}
models:
  - id: m
    tokenizer: ../../testdata/tokenizer-tiny/tokenizer.json
    prefix_index_pages: 4096
    engines:
      - {id: e0, url: "http://e0:1", role: plain, dp_size: 2}
      - {id: e1, url: "http://e1:1", role: plain}
      - {id: e2, url: "http://e2:1"}
    buckets:
      - id: short
        rank: 5
        limits: {min: 0, max: 2000}
        max_context_tokens: 4096
        groups:
          plain: {engine_ids: [e0, e1], policy: {type: cache_aware, admission: {max_running_requests: 40}}}
      - id: long
        limits: {min: 1000}
        slo: {ttft_ms: 500}
        groups:
          plain: {policy: {type: session_aware}}
      - id: rest
        rank: 9
        groups:
          plain: {engine_ids: [e2]}
  - id: n
    engines: [{id: f0, url: "http://f0:1", role: plain}]
    policies: {plain: {type: random, seed: 1}}
"#;
    let config = RouterConfig::from_yaml(yaml).unwrap();
    let served = ValidatedConfig::validate(config.clone()).unwrap();
    let replayed = router_replay::selection(&config).unwrap();
    assert_eq!(served.models.len(), replayed.models.len());
    for (served, replayed) in served.models.into_iter().zip(replayed.models) {
        assert_eq!(served.selection.id, replayed.id);
        assert_eq!(
            served.selection.prefix_index.map(|i| i.config()),
            replayed.prefix_index.map(|i| i.config()),
            "the same prefix index settings"
        );
        // A replay's engines are plain: the router's unknown role, once told, too.
        let served = served
            .selection
            .routing
            .resolve(|_| Some(router_state::Role::Plain))
            .unwrap();
        let replayed = replayed.routing.resolve(|_| None).unwrap();
        // Every bucket, in order, with its limits, targets, groups, members, policies
        // and their caps and settings; only an unseeded generator's state differs.
        assert_eq!(
            without_generator_states(&format!("{served:#?}")),
            without_generator_states(&format!("{replayed:#?}"))
        );
    }
}

/// `debug` without the state of the random generators it shows, drawn from process
/// randomness where no seed is configured.
fn without_generator_states(debug: &str) -> String {
    let mut kept = String::new();
    let mut in_state = false;
    for line in debug.lines() {
        match line.trim() {
            "s: [" => in_state = true,
            "]," if in_state => in_state = false,
            _ if in_state => {}
            _ => {
                kept.push_str(line);
                kept.push('\n');
            }
        }
    }
    assert!(!in_state, "every generator state ends");
    kept
}

#[test]
fn engine_tls_files_are_read_at_the_check_and_each_problem_names_its_file() {
    let dir = std::env::temp_dir().join(format!("switchyard-engine-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("notes.txt");
    std::fs::write(&text, "not a certificate\n").unwrap();
    let missing = dir.join("missing.pem");
    let tls = |section: String| validate(&format!("{MINIMAL}engine_tls: {{{section}}}\n"));
    let not_pem = tls(format!("ca_file: {}", text.display())).unwrap_err();
    let gone = tls(format!(
        "cert_file: {}, key_file: {}",
        missing.display(),
        text.display()
    ))
    .unwrap_err();
    let unpaired = tls(format!("cert_file: {}", text.display())).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        not_pem,
        [format!(
            "engine_tls.ca_file: {}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            text.display()
        )]
    );
    assert_eq!(
        gone,
        [format!(
            "engine_tls.cert_file: {}: No such file or directory (os error 2)",
            missing.display()
        )]
    );
    assert_eq!(
        unpaired,
        ["engine_tls.key_file: must be set with cert_file: the client certificate needs its key"],
        "said once, by the field checks"
    );
    assert!(tls(String::new()).is_ok(), "the system's authorities alone");
}
