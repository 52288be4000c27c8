//! `deploy/grafana` and `deploy/prometheus`: the dashboard and the alerting rules are
//! well formed, and every metric and label their PromQL reads is one a router's
//! `/metrics` serves. A router process runs against simulated engines with traffic
//! that makes a sample of every family they read (a family with labels shows its
//! labels only in samples); a metric renamed in the code, or misspelt in a file,
//! fails here by name.

mod promql;

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Replica, TempFile};
use engine_sim::{RunningEngine, SimConfig};
use serde_json::{Value, json};

/// Upper bound on the wait for the samples; a healthy run needs well under a second.
const GUARD: Duration = Duration::from_secs(30);

/// Labels Prometheus gives every series it scrapes from a target; `/metrics` does not
/// serve them.
const TARGET_LABELS: &[&str] = &["job", "instance"];

const DASHBOARD: &str = "deploy/grafana/switchyard-dashboard.json";
const RULES: &str = "deploy/prometheus/switchyard-alerts.yaml";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn read_json(path: &str) -> Value {
    let text = std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn read_yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One expression of the files: where it is, its PromQL, and the labels its legend or
/// annotations name (which its result must carry).
#[derive(Debug)]
struct Use {
    place: String,
    expr: String,
    shown: Vec<String>,
}

/// The names between `{{` and `}}` in a Grafana legend.
fn legend_labels(legend: &str) -> Vec<String> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|rest| Some(rest.split_once("}}")?.0.trim().to_owned()))
        .collect()
}

/// The `X` of each `$labels.X` in an alert's template.
fn template_labels(template: &str) -> Vec<String> {
    template
        .split("$labels.")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

/// Every panel, those of rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(panels: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in panels.as_array().into_iter().flatten() {
            out.push(panel);
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The dashboard's queries and the `label_values(selector, label)` of its variables.
fn dashboard_uses(dashboard: &Value) -> Vec<Use> {
    let mut uses = Vec::new();
    for panel in panels(dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            uses.push(Use {
                place: format!(
                    "{DASHBOARD}: panel {} query {}",
                    panel["title"], target["refId"]
                ),
                expr: target["expr"].as_str().expect("a query's expr").to_owned(),
                shown: legend_labels(target["legendFormat"].as_str().unwrap_or_default()),
            });
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"]
            .as_str()
            .or(variable["query"].as_str())
            .expect("a variable's query");
        let args = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .and_then(|q| q.rsplit_once(','))
            .unwrap_or_else(|| panic!("{query}: label_values(selector, label)"));
        uses.push(Use {
            place: format!("{DASHBOARD}: variable {}", variable["name"]),
            expr: args.0.trim().to_owned(),
            shown: vec![args.1.trim().to_owned()],
        });
    }
    uses
}

/// The rules' expressions.
fn rule_uses(rules: &Value) -> Vec<Use> {
    let mut uses = Vec::new();
    for group in rules["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let templates = rule["annotations"]
                .as_object()
                .into_iter()
                .chain(rule["labels"].as_object())
                .flat_map(|map| map.values());
            uses.push(Use {
                place: format!("{RULES}: alert {}", rule["alert"]),
                expr: rule["expr"].as_str().expect("an expr").to_owned(),
                shown: templates
                    .flat_map(|t| template_labels(t.as_str().unwrap_or_default()))
                    .collect(),
            });
        }
    }
    uses
}

fn all_uses() -> Vec<Use> {
    let mut uses = dashboard_uses(&read_json(DASHBOARD));
    uses.extend(rule_uses(&read_yaml(RULES)));
    uses
}

/// What `/metrics` serves: each sample name a `# TYPE` line declares (a histogram
/// family's `_bucket`, `_sum` and `_count`), and the labels of the samples of each.
#[derive(Debug, Default)]
struct Served {
    declared: BTreeSet<String>,
    labels: BTreeMap<String, BTreeSet<String>>,
}

impl Served {
    /// Reads a Prometheus text exposition (label values hold no `"` or `\` here:
    /// engine ids, model names and fixed words).
    fn parse(text: &str) -> Self {
        let mut served = Self::default();
        for line in text.lines() {
            if let Some(declared) = line.strip_prefix("# TYPE ") {
                let (name, kind) = declared.split_once(' ').expect("# TYPE name type");
                if kind == "histogram" {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        served.declared.insert(format!("{name}{suffix}"));
                    }
                } else {
                    served.declared.insert(name.to_owned());
                }
            } else if !line.starts_with('#') && !line.is_empty() {
                let end = line.find(['{', ' ']).expect("a sample's value");
                let labels = served.labels.entry(line[..end].to_owned()).or_default();
                if let Some(rest) = line[end..].strip_prefix('{') {
                    let inside = &rest[..rest.find('}').expect("a closing brace")];
                    for pair in inside.split("\",").filter(|p| !p.is_empty()) {
                        labels.insert(pair.split_once('=').expect("label=value").0.to_owned());
                    }
                }
            }
        }
        served
    }
}

/// Every problem of `uses` against `served`, one line each.
fn check(uses: &[Use], served: &Served) -> Vec<String> {
    let mut problems = Vec::new();
    for use_ in uses {
        let place = &use_.place;
        let reads = match promql::read(&use_.expr) {
            Ok(reads) => reads,
            Err(e) => {
                problems.push(format!("{place}: {e} in {:?}", use_.expr));
                continue;
            }
        };
        let mut carried: BTreeSet<&str> = TARGET_LABELS.iter().copied().collect();
        let mut all_served = true;
        for selector in &reads.selectors {
            let metric = &selector.metric;
            let Some(labels) = served.labels.get(metric) else {
                all_served = false;
                problems.push(if served.declared.contains(metric) {
                    format!(
                        "{place}: `{metric}` has no sample to check its labels against: the test's traffic must make one"
                    )
                } else {
                    format!("{place}: `{metric}` is not served by /metrics")
                });
                continue;
            };
            carried.extend(labels.iter().map(String::as_str));
            for label in &selector.labels {
                if !labels.contains(label) && !TARGET_LABELS.contains(&label.as_str()) {
                    problems.push(format!(
                        "{place}: `{metric}` has no label `{label}` (its labels: {labels:?})"
                    ));
                }
            }
        }
        if !all_served {
            // What the missing metric would carry is not known.
            continue;
        }
        for label in reads.by.iter().chain(&reads.matching) {
            if !carried.contains(label.as_str()) {
                problems.push(format!(
                    "{place}: the label list names `{label}`, which no metric of the expression carries"
                ));
            }
        }
        let result: BTreeSet<&str> = if reads.keeps_only_by {
            reads.by.iter().map(String::as_str).collect()
        } else {
            carried
        };
        for label in &use_.shown {
            if !result.contains(label.as_str()) {
                problems.push(format!(
                    "{place}: names `{label}`, which the expression's result does not carry (it carries {result:?})"
                ));
            }
        }
    }
    problems
}

#[test]
fn the_dashboard_and_the_rules_are_well_formed() {
    let dashboard = read_json(DASHBOARD);
    assert_eq!(dashboard["schemaVersion"], 39);
    assert_eq!(dashboard["uid"], "switchyard");
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert_eq!(
        (
            &variables[0]["name"],
            &variables[0]["type"],
            &variables[0]["query"]
        ),
        (
            &json!("datasource"),
            &json!("datasource"),
            &json!("prometheus")
        ),
        "the first variable picks the Prometheus data source"
    );
    let datasource = json!({"type": "prometheus", "uid": "${datasource}"});
    let mut ids = BTreeSet::new();
    for panel in panels(&dashboard) {
        let title = &panel["title"];
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "{title}: its id is taken"
        );
        let at = &panel["gridPos"];
        let (x, w) = (at["x"].as_u64().unwrap(), at["w"].as_u64().unwrap());
        assert!(
            x + w <= 24 && at["h"].as_u64().unwrap() > 0,
            "{title}: {at}"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert!(
            !panel["description"].as_str().unwrap().is_empty(),
            "{title}"
        );
        assert_eq!(panel["datasource"], datasource, "{title}");
        let targets = panel["targets"].as_array().unwrap();
        let refs: BTreeSet<_> = targets
            .iter()
            .map(|t| t["refId"].as_str().unwrap())
            .collect();
        assert!(
            !targets.is_empty() && refs.len() == targets.len(),
            "{title}"
        );
        for target in targets {
            assert_eq!(target["datasource"], datasource, "{title}");
        }
    }

    let rules = read_yaml(RULES);
    let mut alerts = BTreeSet::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().expect("alerting rules only");
            assert!(alerts.insert(name), "{name}: twice");
            let severity = rule["labels"]["severity"].as_str().unwrap();
            assert!(["critical", "warning"].contains(&severity), "{name}");
            for annotation in ["summary", "description"] {
                assert!(
                    rule["annotations"][annotation].is_string(),
                    "{name}: {annotation}"
                );
            }
            let known = ["alert", "expr", "for", "labels", "annotations"];
            for key in rule.as_object().unwrap().keys() {
                assert!(known.contains(&key.as_str()), "{name}: {key}");
            }
        }
    }
    // docs/operations.md's table of alerts names each rule, and nothing else.
    let operations = std::fs::read_to_string(repo("docs/operations.md")).expect("operations.md");
    let documented: BTreeSet<&str> = operations
        .lines()
        .filter_map(|line| line.strip_prefix("| `")?.split('`').next())
        .filter(|name| name.starts_with("Switchyard"))
        .collect();
    assert_eq!(
        documented, alerts,
        "the alerts docs/operations.md describes"
    );

    // The check below reads every expression; a broken one fails it without a router.
    let unreadable: Vec<_> = all_uses()
        .into_iter()
        .filter_map(|u| Some(format!("{}: {}", u.place, promql::read(&u.expr).err()?)))
        .collect();
    assert!(unreadable.is_empty(), "{}", unreadable.join("\n"));
}

#[test]
fn the_checker_names_what_is_not_served() {
    let served = Served::parse(
        "# HELP a_total A.\n# TYPE a_total counter\na_total{model=\"m\",code=\"ok\"} 1\n\
         # TYPE h_seconds histogram\nh_seconds_bucket{stage=\"plain\",le=\"+Inf\"} 1\n\
         h_seconds_sum{stage=\"plain\"} 1\nh_seconds_count{stage=\"plain\"} 1\n# TYPE e_total counter\n",
    );
    let uses = |expr: &str, shown: &str| {
        vec![Use {
            place: "here".into(),
            expr: expr.into(),
            shown: shown.split_whitespace().map(str::to_owned).collect(),
        }]
    };
    let ok = "histogram_quantile(0.9, sum by (le, stage) (rate(h_seconds_bucket[5m]))) \
              / on (stage) sum by (job, stage) (h_seconds_count) and on (model) a_total{code=\"ok\"}";
    assert_eq!(check(&uses(ok, "stage"), &served), Vec::<String>::new());
    for (expr, shown, problem) in [
        ("b_total", "", "`b_total` is not served"),
        ("e_total", "", "`e_total` has no sample"),
        ("h_seconds", "", "`h_seconds` is not served"),
        (
            "a_total{reason=\"x\"}",
            "",
            "`a_total` has no label `reason`",
        ),
        (
            "h_seconds_sum{le=\"1\"}",
            "",
            "`h_seconds_sum` has no label `le`",
        ),
        (
            "sum by (reason) (a_total)",
            "",
            "names `reason`, which no metric",
        ),
        (
            "sum by (model) (a_total)",
            "code",
            "names `code`, which the expression's result",
        ),
        ("a_total", "stage", "names `stage`"),
        ("a_total", "instance", ""),
    ] {
        let problems = check(&uses(expr, shown), &served);
        if problem.is_empty() {
            assert_eq!(problems, Vec::<String>::new(), "{expr}");
        } else {
            assert!(
                problems.len() == 1 && problems[0].contains(problem),
                "{expr}: {problems:?}"
            );
        }
    }
}

/// A simulated engine of `model`.
async fn engine(model: &str, configure: impl FnOnce(&mut SimConfig)) -> RunningEngine {
    let mut config = SimConfig::for_tests();
    config.model = model.into();
    config.tokenizer = Some(tokenizer());
    config.output_tokens = 4;
    configure(&mut config);
    engine_sim::start(config).await.expect("the engine starts")
}

fn tokenizer() -> PathBuf {
    repo("testdata/tokenizer-bytes/tokenizer.json")
}

fn model(id: &str, engines: &[(&str, &RunningEngine)], policy: &str) -> Value {
    let engines: Vec<_> = engines
        .iter()
        .map(|(id, e)| json!({"id": id, "url": e.url(), "role": "plain"}))
        .collect();
    json!({"id": id, "tokenizer": tokenizer(), "block_size": 16, "engines": engines, "policies": {"plain": {"type": policy}}})
}

/// A model of one engine capped at one request in flight, with a queue of one and
/// tenants.
fn queued_model(id: &str, engine: &RunningEngine) -> Value {
    let mut model = model(id, &[("Q0", engine)], "round_robin");
    model["policies"]["plain"]["admission"] = json!({"max_inflight_requests": 1});
    model["flow"] = json!({
        "queue": {"max_wait_ms": 10000, "max_queued": 1},
        "tenants": {"header": "x-tenant", "weights": {"t": 1}},
    });
    model
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_and_label_the_dashboard_and_the_rules_read_is_served() {
    let uses = all_uses();
    // Model m: cache-aware over two engines with KV-event and load feeds. Model b: an
    // engine whose KV pages are not the model's block size (its events are dropped).
    // Model r: an engine that answers 503 to every chat, so requests are retried.
    let feeds = |c: &mut SimConfig| {
        c.page_size = 16;
        c.kv_port = Some(0);
        c.replay_port = Some(0);
        c.load_port = Some(0);
    };
    let (a0, a1) = (engine("m", feeds).await, engine("m", feeds).await);
    let b = engine("b", |c| {
        c.page_size = 32;
        c.kv_port = Some(0);
        c.replay_port = Some(0);
    })
    .await;
    let refusing = engine("r", |c| {
        c.faults.error_rate = 1.0;
        c.faults.error_status = Some(503);
    })
    .await;
    let r1 = engine("r", |_| {}).await;
    // Model q: one engine taking one request at a time, each answer held 200 ms, and a
    // queue of one: of three requests at once one is served, one waits, one is refused.
    let q = engine("q", |c| c.faults.slow_start_ms = 200).await;
    let config = TempFile::new(
        &json!({
            "listen": "127.0.0.1:0",
            "models": [
                model("m", &[("A0", &a0), ("A1", &a1)], "cache_aware"),
                model("b", &[("B0", &b)], "cache_aware"),
                model("r", &[("R0", &refusing), ("R1", &r1)], "round_robin"),
                queued_model("q", &q),
            ],
            "health": {"interval_ms": 50, "timeout_ms": 5000},
        })
        .to_string(),
    );
    let mut router = Replica::start(&config.0, &[]).await;
    let client = reqwest::Client::new();
    let prompt = "a conversation long enough to fill a few pages of the engines' caches ".repeat(4);
    for model in ["m", "m", "b", "r", "r", "r", "r"] {
        let response = client
            .post(router.url("/v1/chat/completions"))
            .json(&json!({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4}))
            .send()
            .await
            .expect("the router answers");
        assert_eq!(response.status(), 200, "model {model}");
        response.bytes().await.expect("the answer");
    }
    let queued = (0..3).map(|_| {
        client
            .post(router.url("/v1/chat/completions"))
            .header("x-tenant", "t")
            .json(&json!({"model": "q", "messages": [{"role": "user", "content": "q"}], "max_tokens": 4}))
            .send()
    });
    let statuses: Vec<u16> = futures_util::future::join_all(queued)
        .await
        .into_iter()
        .map(|r| r.expect("the router answers").status().as_u16())
        .collect();
    assert!(
        statuses.contains(&503),
        "the queue refuses one: {statuses:?}"
    );

    // The feeds' families appear as reports and batches arrive. Past the guard the
    // check below says which are missing.
    let wanted: BTreeSet<String> = uses
        .iter()
        .filter_map(|u| promql::read(&u.expr).ok())
        .flat_map(|r| r.selectors.into_iter().map(|s| s.metric))
        .collect();
    let wait = async {
        loop {
            let text = router.scrape(&client).await;
            let served = Served::parse(&text);
            if wanted.iter().all(|m| served.labels.contains_key(m)) {
                return served;
            }
            tokio::task::yield_now().await;
        }
    };
    let served = match tokio::time::timeout(GUARD, wait).await {
        Ok(served) => served,
        Err(_) => Served::parse(&router.scrape(&client).await),
    };
    router.kill();
    for engine in [a0, a1, b, refusing, r1, q] {
        engine.shutdown().await;
    }
    let problems = check(&uses, &served);
    assert!(
        problems.is_empty(),
        "{} problems:\n{}\nserved: {:?}",
        problems.len(),
        problems.join("\n"),
        served.declared
    );
}
