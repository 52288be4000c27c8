use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use router_policy::CacheSource;

use super::*;

/// Resources of tests that read no file: a model naming a tokenizer gets a note of
/// its path instead, and no shared indexer is reached.
struct NoFiles;

impl Resources for NoFiles {
    type Tokenizer = std::path::PathBuf;
    type Error = String;

    fn tokenizer(
        &mut self,
        _model: &ModelConfig,
        path: &Path,
    ) -> Result<Self::Tokenizer, Self::Error> {
        Ok(path.to_path_buf())
    }

    fn shared_prefix_source(
        &mut self,
        _model: &ModelConfig,
        _indexer: &PrefixIndexerConfig,
    ) -> Option<Arc<dyn CacheSource>> {
        None
    }
}

/// The field checks' problems, then what building the selection finds.
fn problems(config: &RouterConfig) -> Vec<ConfigError> {
    let mut errors = config.check_fields();
    let state = SelectionState::new(config, None);
    if let Err(more) = SelectionPlan::build(config, &state, &mut NoFiles) {
        errors.extend(more);
    }
    errors
}

const MINIMAL: &str = r#"
models:
  - id: chat-model
    engines:
      - {id: A1, url: "http://127.0.0.1:31011", role: plain}
"#;

fn errors(yaml: &str) -> Vec<String> {
    match RouterConfig::from_yaml(yaml) {
        Err(e) => vec![e.to_string()],
        Ok(config) => problems(&config).iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn the_minimal_config_takes_every_default() {
    let config = RouterConfig::from_yaml(MINIMAL).unwrap();
    assert!(problems(&config).is_empty());
    assert_eq!(config.listen, SocketAddr::from(([0, 0, 0, 0], 8080)));
    assert_eq!(config.timeouts, TimeoutConfig::default());
    assert_eq!(config.models[0].block_size, 16);
    assert_eq!(config.models[0].prefix_index_pages, 4 << 20);
    assert_eq!(config.models[0].prefix_index_entries, 16 << 20);
    assert_eq!(config.models[0].buckets, None);
}

#[test]
fn the_tokenize_cache_is_off_at_0_and_bounded_otherwise() {
    let with = |bytes: u64| {
        errors(&format!(
            "limits: {{tokenize_cache_bytes: {bytes}}}\n{MINIMAL}"
        ))
    };
    assert_eq!(with(0), Vec::<String>::new(), "no cache");
    assert_eq!(with(1 << 20), Vec::<String>::new(), "the smallest");
    assert_eq!(with(16 << 30), Vec::<String>::new(), "the largest");
    assert_eq!(with((1 << 20) - 1).len(), 1);
    assert_eq!(with((16 << 30) + 1).len(), 1);
}

#[test]
fn the_client_send_buffer_is_the_kernels_at_0_and_bounded_otherwise() {
    let with = |bytes: u64| {
        errors(&format!(
            "limits: {{client_send_buffer_bytes: {bytes}}}\n{MINIMAL}"
        ))
    };
    assert_eq!(with(0), Vec::<String>::new(), "the kernel's sizing");
    assert_eq!(with(4096), Vec::<String>::new(), "the smallest");
    assert_eq!(with(16 << 20), Vec::<String>::new(), "the largest");
    assert_eq!(
        with(4095),
        [
            "limits.client_send_buffer_bytes: must be 0 (the kernel's sizing) or between 4096 (4 KiB) and 16777216 (16 MiB)"
        ]
    );
    assert_eq!(with((16 << 20) + 1).len(), 1);
    let config = RouterConfig::from_yaml(MINIMAL).unwrap();
    assert_eq!(config.limits.client_send_buffer_bytes, 128 << 10);
}

#[test]
fn tokens_are_never_printed() {
    let config = RouterConfig::from_yaml(&format!(
        "{MINIMAL}admin: {{token: admin-s3cret}}\nprefix_indexer: {{url: 'http://10.0.0.5:30100', token: indexer-s3cret}}\n"
    ))
    .unwrap();
    let printed = format!("{config:?} {config:#?}");
    assert!(
        !printed.contains("admin-s3cret") && !printed.contains("indexer-s3cret"),
        "{printed}"
    );
    assert!(printed.contains("Secret(..)"));
    let token = config.admin.token.as_ref().map(crate::Secret::expose);
    assert_eq!(token, Some("admin-s3cret"), "the token itself is kept");
    let written = serde_json::to_value(&config).unwrap();
    assert_eq!(written["prefix_indexer"]["token"], "indexer-s3cret");
}

#[test]
fn routing_headers_are_all_unless_told_otherwise() {
    use crate::RoutingHeaders;
    let config = RouterConfig::from_yaml(MINIMAL).unwrap();
    assert_eq!(config.routing_headers, RoutingHeaders::All);
    for (name, value) in [
        ("all", RoutingHeaders::All),
        ("without_engines", RoutingHeaders::WithoutEngines),
        ("none", RoutingHeaders::None),
    ] {
        let config =
            RouterConfig::from_yaml(&format!("{MINIMAL}routing_headers: {name}\n")).unwrap();
        assert_eq!(config.routing_headers, value);
    }
    assert_eq!(
        errors(&format!("{MINIMAL}routing_headers: engines\n")).len(),
        1
    );
}

#[test]
fn the_prefix_index_budget_is_set_per_model_and_bounded_below() {
    let yaml = MINIMAL.replace(
        "    engines:",
        "    prefix_index_pages: 65536\n    prefix_index_entries: 1048576\n    engines:",
    );
    let config = RouterConfig::from_yaml(&yaml).unwrap();
    assert_eq!(config.models[0].prefix_index_pages, 65536);
    assert_eq!(config.models[0].prefix_index_entries, 1 << 20);
    assert!(problems(&config).is_empty());
    assert_eq!(
        errors(&MINIMAL.replace(
            "    engines:",
            "    prefix_index_pages: 10\n    prefix_index_entries: 10\n    engines:"
        )),
        [
            "models[0].prefix_index_pages: must be at least 1024",
            "models[0].prefix_index_entries: must be at least 1024"
        ]
    );
}

#[test]
fn the_brief_example_parses_and_validates() {
    let yaml = include_str!("../../../docs/examples/router.yaml");
    let config = RouterConfig::from_yaml(yaml).unwrap();
    assert_eq!(config.models.len(), 2);
    let state = SelectionState::new(&config, None);
    let plan = SelectionPlan::build(&config, &state, &mut NoFiles).unwrap();
    let built = plan
        .models
        .iter()
        .all(|m| matches!(m.routing, ModelRouting::Built(_)));
    assert_eq!((plan.models.len(), built), (2, true));
}

#[test]
fn parse_errors_name_the_path() {
    let unknown = errors("models: []\nlisten_port: 1\n");
    assert!(
        unknown[0].starts_with("listen_port: unknown field `listen_port`"),
        "{unknown:?}"
    );
    let role = errors(
        "models:\n  - id: m\n    engines:\n      - {id: A, url: 'http://a:1', role: prefil}\n",
    );
    assert!(
        role[0].starts_with("models[0].engines[0].role: unknown variant `prefil`"),
        "{role:?}"
    );
    let policy = errors(
        "models:\n  - id: m\n    engines: [{id: A, url: 'http://a:1', role: plain}]\n    buckets:\n      - id: b\n        groups: {plain: {policy: {type: fused_score}}}\n",
    );
    assert!(
        policy[0].starts_with(
            "models[0].buckets[0].groups.plain.policy: policy type `fused_score` was removed"
        ),
        "{policy:?}"
    );
}

#[test]
fn validation_errors_name_their_path() {
    let cases = [
        ("models: []\n", "models: must list at least one model"),
        (
            "timeouts: {connect_ms: 0}\nmodels: [{id: m}]\n",
            "timeouts.connect_ms: must be at least 1",
        ),
        (
            "timeouts: {pool_idle_ms: 0}\nmodels: [{id: m}]\n",
            "timeouts.pool_idle_ms: must be at least 1",
        ),
        (
            "timeouts: {client_header_ms: 18446744073709551615}\nmodels: [{id: m}]\n",
            "timeouts.client_header_ms: must be at most 86400000 (one day)",
        ),
        (
            "limits: {max_connections: 4611686018427387904}\nmodels: [{id: m}]\n",
            "limits.max_connections: must be at most 1048576",
        ),
        (
            "limits: {tokenize_cache_bytes: 1000}\nmodels: [{id: m}]\n",
            "limits.tokenize_cache_bytes: must be 0 (no cache) or between 1048576 (1 MiB) and 17179869184 (16 GiB)",
        ),
        (
            "limits: {tokenize_cache_bytes: 17179869185}\nmodels: [{id: m}]\n",
            "limits.tokenize_cache_bytes: must be 0 (no cache) or between 1048576 (1 MiB) and 17179869184 (16 GiB)",
        ),
        (
            "limits: {zmq_max_message_bytes: 2000000, zmq_memory_bytes: 1999999}\nmodels: [{id: m}]\n",
            "limits.zmq_memory_bytes: must be between limits.zmq_max_message_bytes (2000000: one largest message must fit) and 68719476736 (64 GiB)",
        ),
        (
            "limits: {zmq_max_message_bytes: 68719476737}\nmodels: [{id: m}]\n",
            "limits.zmq_max_message_bytes: must be at most 68719476736 (64 GiB)",
        ),
        (
            "limits: {zmq_memory_bytes: 68719476737}\nmodels: [{id: m}]\n",
            "limits.zmq_memory_bytes: must be between limits.zmq_max_message_bytes (16777216: one largest message must fit) and 68719476736 (64 GiB)",
        ),
        (
            "models: [{id: m, buckets: [{id: 'b\"} 1', groups: {plain: {}}}]}]\n",
            "models[0].buckets[0].id: may hold only visible ASCII characters other than \" \\ { } , =, not '\"'",
        ),
        (
            "health: {failure_threshold: 0}\nmodels: [{id: m}]\n",
            "health.failure_threshold: must be at least 1",
        ),
        (
            "health: {breaker_cooldown_ms: 18446744073709551615}\nmodels: [{id: m}]\n",
            "health.breaker_cooldown_ms: must be at most 86400000 (one day)",
        ),
        (
            "listen: 127.0.0.1:9000\nadmin: {token: t, listen: 127.0.0.1:9000}\nmodels: [{id: m}]\n",
            "admin.listen: must differ from listen; omit it to serve the admin API on the public address",
        ),
        ("models: [{id: ''}]\n", "models[0].id: must not be empty"),
        (
            "models: [{id: m}, {id: m}]\n",
            "models[1].id: duplicate model id \"m\" (also models[0])",
        ),
        (
            "models: [{id: m, block_size: 0}]\n",
            "models[0].block_size: must be at least 1",
        ),
        (
            "models:\n  - {id: m, engines: [{id: A, url: 'http://a:1'}]}\n  - {id: n, engines: [{id: A, url: 'http://b:1'}]}\n",
            "models[1].engines[0].id: duplicate engine id \"A\" (also models[0].engines[0].id)",
        ),
        (
            "engine_tls: {cert_file: /etc/router.pem}\nmodels: [{id: m}]\n",
            "engine_tls.key_file: must be set with cert_file: the client certificate needs its key",
        ),
        (
            "engine_tls: {key_file: /etc/router.key}\nmodels: [{id: m}]\n",
            "engine_tls.cert_file: must be set with key_file: the key needs its client certificate",
        ),
        (
            "engine_tls: {ca_file: ''}\nmodels: [{id: m}]\n",
            "engine_tls.ca_file: must name a file",
        ),
        (
            "models: [{id: m, engines: [{id: A, url: 'http://a:1', dp_size: 0}]}]\n",
            "models[0].engines[0].dp_size: must be at least 1",
        ),
        (
            "models: [{id: m, engines: [{id: A, url: 'http://a:1', dp_size: 4000000000}]}]\n",
            "models[0].engines[0].dp_size: must be at most 1024",
        ),
        (
            "models: [{id: 'm\"} 1', engines: []}]\n",
            "models[0].id: may hold only visible ASCII characters other than \" \\ { } , =, not '\"'",
        ),
        (
            "models: [{id: m, engines: [{id: 'A 1', url: 'http://a:1'}]}]\n",
            "models[0].engines[0].id: may hold only visible ASCII characters other than \" \\ { } , =, not ' '",
        ),
        (
            "models: [{id: m, engines: [{id: A, url: 'http://a:1', role: plain}, {id: P, url: 'http://p:1', role: prefill}]}]\n",
            "models[0].engines[1].role: a prefill engine cannot join a model served by plain engines (models[0].engines[0]); \
             a model is either all plain or all prefill/decode",
        ),
        (
            "policies: {decode: {type: random, admission: {max_running_requests: 0}}}\nmodels: [{id: m}]\n",
            "policies.decode: admission.max_running_requests must be at least 1: a cap of 0 admits nothing",
        ),
        (
            "models:\n  - id: m\n    engines: [{id: P1, url: 'http://p:1', role: prefill}, {id: D1, url: 'http://d:1', role: decode}]\n    buckets:\n      - id: b\n        groups: {pd: {prefill: {engine_ids: [P1]}, decode: {engine_ids: [P1]}}}\n",
            "models[0].buckets[0].groups.pd.decode.engine_ids[0]: engine \"P1\" is a prefill engine, but this group picks decode engines",
        ),
    ];
    for (yaml, expected) in cases {
        assert_eq!(errors(yaml), [expected], "{yaml}");
    }
}

#[cfg(feature = "tls")]
#[test]
fn https_engines_are_accepted_with_the_engine_tls_section_or_without() {
    let https = r#"
models:
  - id: m
    engines:
      - {id: A1, url: "https://engine-1.example:8443", role: plain}
      - {id: A2, url: "http://10.0.0.8:30000", role: plain}
"#;
    assert_eq!(errors(https), Vec::<String>::new());
    let with_tls = format!(
        "engine_tls: {{ca_file: /etc/ca.pem, cert_file: /etc/router.pem, key_file: /etc/router.key}}\n{https}"
    );
    let config = RouterConfig::from_yaml(&with_tls).unwrap();
    assert!(problems(&config).is_empty());
    assert_eq!(
        config.engine_tls,
        Some(EngineTlsConfig {
            ca_file: Some("/etc/ca.pem".into()),
            cert_file: Some("/etc/router.pem".into()),
            key_file: Some("/etc/router.key".into()),
        })
    );
    assert_eq!(
        errors("engine_tls: {ca: /etc/ca.pem}\nmodels: [{id: m}]\n"),
        [
            "engine_tls.ca: unknown field `ca`, expected one of `ca_file`, `cert_file`, `key_file` at line 1 column 14"
        ]
    );
    assert_eq!(
        errors("models: [{id: m, engines: [{id: A, url: 'ftp://a:1'}]}]\n"),
        ["models[0].engines[0].url: must start with http:// or https://"]
    );
}

#[test]
fn engines_without_a_role_are_checked_at_startup_not_statically() {
    let yaml = "models:\n  - id: m\n    engines: [{id: X, url: 'http://x:1'}]\n    buckets: [{id: b, groups: {pd: {prefill: {engine_ids: [X]}, decode: {engine_ids: []}}}}]\n";
    assert_eq!(errors(yaml), Vec::<String>::new());
}

#[test]
fn the_schema_describes_the_config() {
    let schema = RouterConfig::json_schema().to_string();
    for field in [
        "listen",
        "models",
        "buckets",
        "engine_ids",
        "first_byte_ms",
        "breaker_cooldown_ms",
        "max_inflight_requests",
        "engine_tls",
        "ca_file",
    ] {
        assert!(schema.contains(field), "the schema names {field}");
    }
}

#[test]
fn the_affinity_section_names_removed_modes_and_checks_its_values() {
    let with = |section: &str| errors(&format!("{MINIMAL}affinity: {section}\n"));
    let soft = with("{mode: soft}");
    assert!(
        soft[0].starts_with(
            "affinity: option `affinity_mode` was removed: `session_aware` always reuses"
        ),
        "{soft:?}"
    );
    let pair = with("{stable_pair: true}");
    assert!(
        pair[0].contains("option `stable_pair` was removed"),
        "{pair:?}"
    );
    let global = with("{session_affinity_mode: global-rebind}");
    assert!(
        global[0].contains("global modes are not supported"),
        "{global:?}"
    );
    assert_eq!(
        with("{session_header: 'not a header', max_entries: 0}"),
        [
            "affinity.session_header: is not a valid HTTP header name",
            "affinity.max_entries: must be at least 1"
        ]
    );
    assert_eq!(
        with("{routing_key_header: X-Session-Id}"),
        ["affinity.routing_key_header: must differ from affinity.session_header"]
    );
    let config = RouterConfig::from_yaml(&format!(
        "{MINIMAL}affinity: {{session_header: x-conversation, idle_timeout_ms: 1000}}\n"
    ))
    .unwrap();
    assert_eq!(config.affinity.session_header, "x-conversation");
    assert_eq!(
        config.affinity.store_config().idle_timeout,
        std::time::Duration::from_secs(1)
    );
}

#[test]
fn the_affinity_backend_is_checked_and_a_redis_url_never_printed() {
    let with = |section: &str| errors(&format!("{MINIMAL}affinity: {section}\n"));
    assert_eq!(
        with("{backend: redis}"),
        ["affinity.redis: is required by backend redis"]
    );
    assert_eq!(
        with("{redis: {url: 'redis://127.0.0.1:6379/0'}}"),
        ["affinity.redis: is set but affinity.backend is not redis"]
    );
    let bad = with(
        "{backend: redis, idle_timeout_ms: 1000, redis: {url: 'http://h:1', timeout_ms: 0, local_cache_ms: 1000, reconnect_interval_ms: 0}}",
    );
    // The URL is checked as the Redis store reads it, in a build with the store.
    let (url, rest) = bad.split_at(usize::from(cfg!(feature = "redis")));
    if let Some(url) = url.first() {
        assert!(
            url.starts_with("affinity.redis.url: is not a usable redis:// URL"),
            "{bad:?}"
        );
    }
    assert_eq!(
        rest,
        [
            "affinity.redis.timeout_ms: must be 1 to 10000",
            "affinity.redis.local_cache_ms: must be below affinity.idle_timeout_ms",
            "affinity.redis.reconnect_interval_ms: must be at least 1",
        ]
    );
    for prefix in ["p".repeat(129), "''".into(), "'a b'".into()] {
        assert_eq!(
            with(&format!(
                "{{backend: redis, redis: {{url: 'redis://h', key_prefix: {prefix}}}}}"
            )),
            ["affinity.redis.key_prefix: must be 1 to 128 bytes of visible ASCII"],
            "{prefix}"
        );
    }
    assert_eq!(
        with("{idle_timeout_ms: 86400001}"),
        ["affinity.idle_timeout_ms: must be at most 86400000 (one day)"]
    );
    let config = RouterConfig::from_yaml(&format!(
        "{MINIMAL}affinity: {{backend: redis, redis: {{url: 'redis://user:hunter2@10.0.0.9:6379/2'}}}}\n"
    ))
    .unwrap();
    assert!(!format!("{config:?}").contains("hunter2"));
}

#[test]
fn the_discovery_section_is_checked() {
    let with = |section: &str| errors(&format!("{MINIMAL}discovery: {{kubernetes: {section}}}\n"));
    let bad = with(
        "{namespace: Not_A_Label, api_url: 'ftp://x', relist_interval_ms: 10, debounce_ms: 60001, models: [{model: nope, selector: {}, port: 0}, {model: chat-model, selector: {'bad key!': v}, port: 1}]}",
    );
    let expected = [
        "discovery.kubernetes.namespace: must be a DNS label: 1 to 63 lowercase letters, digits and '-'",
        "discovery.kubernetes.api_url: must start with http:// or https://",
        "discovery.kubernetes.relist_interval_ms: must be 1000 to 86400000",
        "discovery.kubernetes.debounce_ms: must be at most 60000",
        "discovery.kubernetes.models[0].model: must be a model of `models`",
        "discovery.kubernetes.models[0].selector: must name at least one label (an empty selector is every pod)",
        "discovery.kubernetes.models[0].port: ports must be 1 to 65535",
        "discovery.kubernetes.models[1].selector: `bad key!: v` is not a Kubernetes label",
    ];
    let kubernetes = cfg!(feature = "kubernetes");
    let bad: Vec<&str> = bad
        .iter()
        .map(String::as_str)
        .filter(|e| kubernetes || !e.contains("cargo feature kubernetes"))
        .collect();
    assert_eq!(bad, expected);
    assert_eq!(
        with("{namespace: llm, models: []}")
            .first()
            .map(String::as_str),
        if kubernetes {
            Some(
                "discovery.kubernetes.models: must name at least one model's pods (or `pools` an InferencePool)",
            )
        } else {
            Some(
                "discovery.kubernetes: this build has no Kubernetes discovery (cargo feature kubernetes)",
            )
        }
    );
    let config = RouterConfig::from_yaml(&format!(
        "{MINIMAL}discovery: {{kubernetes: {{namespace: llm, models: [{{model: chat-model, selector: {{app: sglang}}, role: prefill, port: 30000, bootstrap_port: 8998}}]}}}}\n"
    ))
    .unwrap();
    let kubernetes_config = config.discovery.kubernetes.clone().unwrap();
    assert_eq!(
        kubernetes_config.relist_interval_ms, 60_000,
        "the default relist"
    );
    assert_eq!(kubernetes_config.debounce_ms, 500);
    assert!(kubernetes_config.pools.is_empty(), "no pools by default");
}

#[test]
fn the_discovery_sections_pools_are_checked() {
    let with = |section: &str| {
        let found = errors(&format!(
            "models: [{{id: a}}, {{id: b}}]\ndiscovery: {{kubernetes: {{namespace: llm, {section}}}}}\n"
        ));
        let kubernetes = cfg!(feature = "kubernetes");
        found
            .into_iter()
            .filter(|e| kubernetes || !e.contains("cargo feature kubernetes"))
            .collect::<Vec<_>>()
    };
    // Pools alone are enough, as are pools beside selectors of other models; a name
    // may have dots, as a DNS subdomain does.
    assert_eq!(
        with("pools: [{model: a, name: a-pool.v1}]"),
        [] as [&str; 0]
    );
    assert_eq!(
        with("models: [{model: a, selector: {app: a}, port: 1}], pools: [{model: b, name: b}]"),
        [] as [&str; 0]
    );
    let long = format!("{}.{}", "a".repeat(63), "b".repeat(190));
    assert_eq!(long.len(), 254);
    let bad = with(&format!(
        "models: [{{model: a, selector: {{app: a}}, port: 1}}], pools: [{{model: nope, name: Pool}}, {{model: a, name: p}}, {{model: b, name: p}}, {{model: b, name: '-p'}}, {{model: b, name: 'p..q'}}, {{model: b, name: ''}}, {{model: b, name: '{long}'}}, {{model: b, name: 'p_q'}}]"
    ));
    let name = "must be a DNS subdomain: 1 to 253 lowercase letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit";
    let expected = [
        "discovery.kubernetes.pools[0].model: must be a model of `models`".to_owned(),
        format!("discovery.kubernetes.pools[0].name: {name}"),
        "discovery.kubernetes.pools[1].model: model \"a\" is in `models` too: name its pods by selectors or by pools, not both".to_owned(),
        "discovery.kubernetes.pools[2].name: pool \"p\" is named twice".to_owned(),
        format!("discovery.kubernetes.pools[3].name: {name}"),
        format!("discovery.kubernetes.pools[4].name: {name}"),
        format!("discovery.kubernetes.pools[5].name: {name}"),
        format!("discovery.kubernetes.pools[6].name: {name}"),
        format!("discovery.kubernetes.pools[7].name: {name}"),
    ];
    assert_eq!(bad, expected);
    // The longest name there may be is one.
    let longest = &long[1..];
    assert_eq!(
        with(&format!("pools: [{{model: a, name: '{longest}'}}]")),
        [] as [&str; 0]
    );
    // A pool is read as written, and written back as read.
    let config = RouterConfig::from_yaml(
        "models: [{id: a}]\ndiscovery: {kubernetes: {namespace: llm, pools: [{model: a, name: a-pool}]}}\n",
    )
    .unwrap();
    let kubernetes = config.discovery.kubernetes.clone().unwrap();
    assert!(kubernetes.models.is_empty());
    assert_eq!(
        kubernetes.pools,
        [KubernetesPool {
            model: "a".into(),
            name: "a-pool".into()
        }],
        "the pool as written"
    );
    assert!(
        RouterConfig::from_yaml(
            "models: [{id: a}]\ndiscovery: {kubernetes: {namespace: llm, pools: [{model: a, name: p, port: 1}]}}\n"
        )
        .is_err(),
        "a pool has no port of its own: the InferencePool's is used"
    );
}

#[test]
fn objectives_from_the_cluster_need_pools_a_header_ordered_higher_first_and_a_queue() {
    let with = |models: &str, section: &str| {
        let found = errors(&format!(
            "models: [{models}]\ndiscovery: {{kubernetes: {{namespace: llm, {section}}}}}\n"
        ));
        let kubernetes = cfg!(feature = "kubernetes");
        found
            .into_iter()
            .filter(|e| kubernetes || !e.contains("cargo feature kubernetes"))
            .collect::<Vec<_>>()
    };
    let header = "flow: {queue: {max_wait_ms: 100}, priority: {header: x-gateway-inference-objective, bands: [1]}}";
    assert_eq!(
        with(
            &format!("{{id: a, {header}}}"),
            "pools: [{model: a, name: p}], objectives: true"
        ),
        [] as [&str; 0]
    );
    assert_eq!(
        with(
            &format!("{{id: a, {header}}}"),
            "models: [{model: a, selector: {app: a}, port: 1}], objectives: true"
        ),
        [
            "discovery.kubernetes.objectives: reads the InferenceObjectives of `pools`, which names none"
        ]
    );
    let why = "discovery.kubernetes.objectives reads the model's InferenceObjectives";
    assert_eq!(
        with(
            "{id: a}, {id: b, flow: {queue: {max_wait_ms: 100}, priority: {header: x-o, order: lower_first, bands: [1]}}}, {id: c, flow: {priority: {header: x-o}}}",
            // A model behind two pools is told once.
            "pools: [{model: a, name: p}, {model: a, name: p2}, {model: b, name: q}, {model: c, name: r}], objectives: true"
        ),
        [
            format!(
                "models[0].flow.priority.header: must name the header that carries an objective's name (x-gateway-inference-objective): {why}"
            ),
            format!(
                "models[0].flow.queue: needs a queue and priority.bands for priorities to order anything: {why}"
            ),
            format!(
                "models[1].flow.priority.order: must be higher_first, as InferenceObjectives' priorities are: {why}"
            ),
            format!(
                "models[2].flow.queue: needs a queue and priority.bands for priorities to order anything: {why}"
            ),
        ]
    );
    // Without objectives, a pool's model needs no header.
    assert_eq!(
        with("{id: a}", "pools: [{model: a, name: p}]"),
        [] as [&str; 0]
    );
}

#[test]
fn the_schema_is_the_published_one() {
    // `switchyard config schema` prints it; a change to the file's shape shows here
    // and is made on purpose: regenerate with
    // `cargo run -p switchyard -- config schema > testdata/config-schema.json`.
    let published: serde_json::Value =
        serde_json::from_str(include_str!("../../../testdata/config-schema.json"))
            .expect("the published schema is JSON");
    assert_eq!(RouterConfig::json_schema(), published);
}

#[test]
fn problems_are_listed_section_by_section() {
    let config = RouterConfig::from_yaml(
        "timeouts: {connect_ms: 0}\nlimits: {max_connections: 0, tokenize_concurrency: 0}\nhealth: {interval_ms: 0}\nload: {freshness_ms: 0}\nmodels: []\n",
    )
    .unwrap();
    let listed: Vec<String> = config
        .check_fields()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        listed,
        [
            "timeouts.connect_ms: must be at least 1",
            "limits.max_connections: must be at least 1",
            "limits.tokenize_concurrency: must be between 1 and 1024",
            "health.interval_ms: must be at least 1",
            "load.freshness_ms: must be at least 1",
            "models: must list at least one model",
        ]
    );
}

#[test]
fn the_feeds_memory_holds_one_largest_message_by_default() {
    let config = RouterConfig::from_yaml(MINIMAL).unwrap();
    assert_eq!(config.limits.feed_memory_bytes(), 256 << 20);
    let large = RouterConfig::from_yaml(&format!(
        "limits: {{zmq_max_message_bytes: 536870912}}\n{MINIMAL}"
    ))
    .unwrap();
    assert!(problems(&large).is_empty());
    assert_eq!(large.limits.feed_memory_bytes(), 512 << 20);
    let set = RouterConfig::from_yaml(&format!(
        "limits: {{zmq_memory_bytes: 1073741824}}\n{MINIMAL}"
    ))
    .unwrap();
    assert_eq!(set.limits.feed_memory_bytes(), 1 << 30);
}

#[test]
fn the_prefix_indexer_section_names_one_indexer_or_a_few_in_order() {
    let with = |section: &str| errors(&format!("{MINIMAL}prefix_indexer: {section}\n"));
    assert!(with("{url: 'http://10.0.0.5:30100'}").is_empty());
    assert!(with("{urls: ['http://10.0.0.5:30100', 'https://indexer-b:30100']}").is_empty());
    assert_eq!(
        with("{url: 'http://a:1', urls: ['http://b:1']}"),
        ["prefix_indexer.urls: set url or urls, not both"]
    );
    assert_eq!(
        with("{timeout_ms: 50}"),
        ["prefix_indexer.url: one indexer's url (or urls) is required"]
    );
    assert_eq!(
        with("{urls: ['http://a:1', 'ftp://b', 'http://a:1']}"),
        [
            "prefix_indexer.urls[1]: must start with http:// or https://",
            "prefix_indexer.urls[2]: named twice",
        ]
    );
    assert_eq!(
        with("{urls: ['http://a:1', 'http://b:1', 'http://c:1', 'http://d:1', 'http://e:1']}"),
        ["prefix_indexer.urls: at most 4 indexers"]
    );
    let config = RouterConfig::from_yaml(&format!(
        "{MINIMAL}prefix_indexer: {{urls: ['http://b:1', 'http://a:1']}}\n"
    ))
    .unwrap();
    let section = config.prefix_indexer.unwrap();
    assert_eq!(
        section.indexer_urls(),
        ["http://b:1", "http://a:1"],
        "in the file's order"
    );
    assert_eq!(
        PrefixIndexerConfig::new("http://a:1").indexer_urls(),
        ["http://a:1"]
    );
}

#[test]
fn the_picker_needs_its_own_address_bounded_streams_and_no_prefill_decode_model() {
    let plain = "models: [{id: m, engines: [{id: A, url: 'http://10.0.0.1:1', role: plain}]}]\n";
    assert!(errors(&format!("picker: {{listen: 127.0.0.1:9002}}\n{plain}")).is_empty());
    for (yaml, want) in [
        (
            format!("listen: 127.0.0.1:9000\npicker: {{listen: 127.0.0.1:9000}}\n{plain}"),
            "picker.listen: must differ from listen and admin.listen",
        ),
        (
            format!("admin: {{token: t, listen: 127.0.0.1:9090}}\npicker: {{listen: 127.0.0.1:9090}}\n{plain}"),
            "picker.listen: must differ from listen and admin.listen",
        ),
        (
            format!("picker: {{listen: 127.0.0.1:9002, max_streams: 0}}\n{plain}"),
            "picker.max_streams: must be between 1 and 1048576",
        ),
        (
            "picker: {listen: 127.0.0.1:9002}\nmodels: [{id: m, engines: [{id: P, url: 'http://10.0.0.1:1', role: prefill}, {id: D, url: 'http://10.0.0.2:1', role: decode}]}]\n".to_owned(),
            "models[0]: model \"m\" has prefill/decode engines, which the endpoint picker cannot serve",
        ),
        (
            "picker: {listen: 127.0.0.1:9002}\nmodels: [{id: m}]\ndiscovery: {kubernetes: {namespace: llm, models: [{model: m, selector: {app: m}, role: decode, port: 1}]}}\n".to_owned(),
            "discovery.kubernetes.models[0].role: prefill and decode engines cannot be served by the endpoint picker",
        ),
    ] {
        let found = errors(&yaml);
        assert!(
            found.iter().any(|e| e.starts_with(want)),
            "{yaml}: {found:?}"
        );
    }
}
