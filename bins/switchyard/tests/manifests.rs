//! `deploy/kubernetes`: the base and each overlay as `kubectl kustomize` renders them
//! (what `kubectl apply -k` applies). Every object is read into its Kubernetes API type
//! and must come back out field for field (a misspelt or misplaced field, which the
//! types would drop, fails here), and the pieces fit: the role lets the routers watch
//! pods, the deployment runs the image the Dockerfile builds under that service
//! account with the config map's file, that file is a router configuration the
//! router accepts, and each layout is what its name says. The Gateway API objects
//! (an `InferencePool`, an `HTTPRoute`), which k8s-openapi has no types for, are
//! read into the small types below, which know the fields the overlays write.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use router_config::{AffinityBackendKind, EngineRole, KubernetesPool, RouterConfig};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The image the Dockerfile's docs build, which every layout runs.
const IMAGE: &str = concat!("switchyard:", env!("CARGO_PKG_VERSION"));

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// kubectl: the one on PATH, else the one `cargo xtask ci` installs into the venv.
fn kubectl() -> PathBuf {
    let works = |kubectl: &Path| {
        Command::new(kubectl)
            .args(["version", "--client"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works(Path::new("kubectl")) {
        return "kubectl".into();
    }
    let cache =
        std::env::var_os("SWITCHYARD_CACHE").map_or_else(|| root().join(".cache"), PathBuf::from);
    let venv = cache.join("venv/bin/kubectl");
    assert!(
        works(&venv),
        "kubectl 1.27 or later (kustomize v5) renders deploy/kubernetes: install it, or run \
         `cargo xtask ci`, which installs it into {}",
        venv.display()
    );
    venv
}

/// The objects of one layout, each read into its type.
#[derive(Default)]
struct Rendered {
    accounts: Vec<ServiceAccount>,
    roles: Vec<Role>,
    bindings: Vec<RoleBinding>,
    config_maps: Vec<ConfigMap>,
    deployments: Vec<Deployment>,
    services: Vec<Service>,
    pools: Vec<InferencePool>,
    objectives: Vec<InferenceObjective>,
    routes: Vec<HttpRoute>,
}

/// An `InferenceObjective` of `inference.networking.x-k8s.io/v1alpha2`, as far as the
/// overlays write one.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct InferenceObjective {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: InferenceObjectiveSpec,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct InferenceObjectiveSpec {
    priority: Option<i64>,
    pool_ref: PoolRef,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    name: String,
}

/// An `InferencePool` of `inference.networking.k8s.io/v1`, as far as the overlays
/// write one.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct InferencePool {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: InferencePoolSpec,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct InferencePoolSpec {
    selector: PoolSelector,
    target_ports: Vec<PortNumber>,
    endpoint_picker_ref: EndpointPickerRef,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PoolSelector {
    match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PortNumber {
    number: i32,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EndpointPickerRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    name: String,
    port: PortNumber,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    failure_mode: Option<String>,
}

/// An `HTTPRoute` of `gateway.networking.k8s.io/v1`, as far as the overlays write
/// one.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HttpRoute {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: HttpRouteSpec,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HttpRouteSpec {
    parent_refs: Vec<ObjectRef>,
    rules: Vec<HttpRouteRule>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HttpRouteRule {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    matches: Vec<Value>,
    backend_refs: Vec<ObjectRef>,
}

/// A parent or backend reference.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ObjectRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    port: Option<i32>,
}

/// `kubectl kustomize deploy/kubernetes/{dir}`, every object read into its type; a
/// warning (a deprecated kustomization field) fails too.
fn render(dir: &str) -> Rendered {
    let output = Command::new(kubectl())
        .arg("kustomize")
        .arg(root().join("deploy/kubernetes").join(dir))
        .output()
        .expect("kubectl starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stderr.is_empty(),
        "kubectl kustomize {dir} (kustomize v5 or later): {}\n{stderr}",
        output.status
    );
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    let mut rendered = Rendered::default();
    for document in serde_norway::Deserializer::from_str(&text) {
        let written = Value::deserialize(document).unwrap_or_else(|e| panic!("{dir}: {e}"));
        let kind = written["kind"].as_str().unwrap_or_default().to_owned();
        let name = format!("{dir}: {kind} {}", written["metadata"]["name"]);
        match kind.as_str() {
            "ServiceAccount" => rendered.accounts.push(read(&name, written)),
            "Role" => rendered.roles.push(read(&name, written)),
            "RoleBinding" => rendered.bindings.push(read(&name, written)),
            "ConfigMap" => rendered.config_maps.push(read(&name, written)),
            "Deployment" => rendered.deployments.push(read(&name, written)),
            "Service" => rendered.services.push(read(&name, written)),
            "InferencePool" => rendered.pools.push(read(&name, written)),
            "InferenceObjective" => rendered.objectives.push(read(&name, written)),
            "HTTPRoute" => rendered.routes.push(read(&name, written)),
            _ => panic!("{name}: a kind this test does not read"),
        }
    }
    rendered
}

/// `written` as its type; panics when the type does not hold all of it.
fn read<T: DeserializeOwned + Serialize>(name: &str, written: Value) -> T {
    let typed: T =
        serde_json::from_value(written.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let read_back = serde_json::to_value(&typed).expect("serializes");
    assert_eq!(read_back, written, "{name}: a field its type does not know");
    typed
}

/// What the Dockerfile says of the image: its docs name [`IMAGE`]; the port it
/// exposes and its default arguments.
fn dockerfile() -> (i32, Vec<String>) {
    let text = std::fs::read_to_string(root().join("Dockerfile")).expect("the Dockerfile");
    assert!(
        text.contains(&format!("docker build -t {IMAGE} .")),
        "the Dockerfile's docs build {IMAGE}"
    );
    let line = |keyword: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(keyword))
            .unwrap_or_else(|| panic!("the Dockerfile has {keyword}"))
    };
    let port = line("EXPOSE ").trim().parse().expect("one port");
    let cmd = serde_json::from_str(line("CMD ")).expect("CMD in exec form");
    (port, cmd)
}

/// The checks every layout passes; its router deployment's pod spec and replicas,
/// and its router configuration.
fn fits_together(dir: &str, rendered: &Rendered) -> (PodSpec, i32, RouterConfig) {
    let [account] = &rendered.accounts[..] else {
        panic!("{dir}: one service account")
    };
    let [role] = &rendered.roles[..] else {
        panic!("{dir}: one role")
    };
    let [binding] = &rendered.bindings[..] else {
        panic!("{dir}: one role binding")
    };
    assert_eq!(binding.role_ref.name, role.metadata.name.clone().unwrap());
    let subjects = binding.subjects.clone().expect("subjects");
    assert_eq!(subjects[0].name, account.metadata.name.clone().unwrap());

    let deployment = named(&rendered.deployments, |d| &d.metadata.name, "switchyard");
    let spec = deployment.spec.clone().expect("spec");
    let pod = spec.template.spec.expect("pod spec");
    assert_eq!(pod.service_account_name, account.metadata.name);
    let container = &pod.containers[0];
    assert_eq!(container.image.as_deref(), Some(IMAGE), "{dir}: the image");
    let (exposed, cmd) = dockerfile();
    let args = container.args.clone().expect("args");
    assert_eq!(
        args[..3],
        cmd,
        "{dir}: the image's default arguments, and more"
    );
    let port = &container.ports.as_ref().expect("ports")[0];
    assert_eq!(
        port.container_port, exposed,
        "{dir}: the port the image exposes"
    );

    let volume = &pod.volumes.as_ref().expect("volumes")[0];
    let config_map = volume.config_map.as_ref().expect("a config map volume");
    let mount = &container.volume_mounts.as_ref().expect("mounts")[0];
    assert_eq!(mount.name, volume.name);
    let config = named(
        &rendered.config_maps,
        |c| &c.metadata.name,
        &config_map.name,
    );
    let file = args[2]
        .strip_prefix(&format!("{}/", mount.mount_path))
        .unwrap_or_else(|| panic!("{dir}: --config {} is in the mount", args[2]));
    let service = named(&rendered.services, |s| &s.metadata.name, "switchyard");
    assert_eq!(
        service.spec.clone().expect("spec").selector,
        deployment.metadata.labels,
        "{dir}: the service selects the router pods"
    );

    for config_map in &rendered.config_maps {
        for (key, text) in config_map.data.iter().flatten() {
            let router = RouterConfig::from_yaml(text)
                .unwrap_or_else(|e| panic!("{dir}: {key}: a router configuration: {e}"));
            router_http::ValidatedConfig::validate(router)
                .unwrap_or_else(|e| panic!("{dir}: {key}: a valid configuration: {e:?}"));
        }
    }
    let router = RouterConfig::from_yaml(&config.data.as_ref().expect("data")[file])
        .expect("a router configuration");
    assert_eq!(
        i32::from(router.listen.port()),
        exposed,
        "{dir}: the router listens on the port the image exposes"
    );
    let kubernetes = router.discovery.kubernetes.clone().expect("pod discovery");
    assert_eq!(
        Some(kubernetes.namespace.clone()),
        role.metadata.namespace,
        "{dir}: it watches the namespace the role is for"
    );
    // The role lets discovery read what it reads: pods, and InferencePools exactly
    // when it follows pools.
    let rules = role.rules.clone().expect("rules");
    let reads = |group: &str, resource: &str| {
        rules.iter().any(|rule: &PolicyRule| {
            rule.api_groups.as_deref() == Some(&[group.to_owned()][..])
                && rule.resources.as_deref() == Some(&[resource.to_owned()][..])
                && rule.verbs == ["get", "list", "watch"]
        })
    };
    assert!(reads("", "pods"), "{dir}: the role reads pods");
    let pools = !kubernetes.pools.is_empty();
    assert_eq!(
        reads("inference.networking.k8s.io", "inferencepools"),
        pools,
        "{dir}: the role reads InferencePools when discovery follows pools"
    );
    assert_eq!(
        reads("inference.networking.x-k8s.io", "inferenceobjectives"),
        kubernetes.objectives,
        "{dir}: the role reads InferenceObjectives when discovery follows them"
    );
    assert_eq!(
        rules.len(),
        1 + usize::from(pools) + usize::from(kubernetes.objectives),
        "{dir}: the role grants nothing else"
    );
    (pod, spec.replicas.expect("replicas"), router)
}

/// The object of `objects` named `name`.
fn named<'a, T>(objects: &'a [T], name: impl Fn(&T) -> &Option<String>, wanted: &str) -> &'a T {
    objects
        .iter()
        .find(|o| name(o).as_deref() == Some(wanted))
        .unwrap_or_else(|| panic!("{wanted} is rendered"))
}

#[test]
fn each_overlay_is_checked() {
    let mut overlays: Vec<String> = std::fs::read_dir(root().join("deploy/kubernetes/overlays"))
        .expect("deploy/kubernetes/overlays")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    overlays.sort();
    assert_eq!(
        overlays,
        ["gateway", "prefill-decode", "replicas-redis", "single"],
        "each overlay has its test below"
    );
}

#[test]
fn the_base_runs_three_replicas_sharing_sessions_by_rendezvous() {
    let (_, replicas, router) = fits_together("base", &render("base"));
    assert_eq!(replicas, 3);
    assert_eq!(router.affinity.backend, AffinityBackendKind::Rendezvous);
}

#[test]
fn the_single_overlay_runs_one_replica_keeping_its_bindings() {
    let (_, replicas, router) = fits_together("single", &render("overlays/single"));
    assert_eq!(replicas, 1);
    assert_eq!(router.affinity.backend, AffinityBackendKind::Local);
}

#[test]
fn the_redis_overlay_shares_bindings_through_the_redis_it_deploys() {
    let rendered = render("overlays/replicas-redis");
    let (pod, replicas, router) = fits_together("replicas-redis", &rendered);
    assert_eq!(replicas, 3, "three replicas, as docs/operations.md says");
    assert_eq!(router.affinity.backend, AffinityBackendKind::Redis);
    let url = router.affinity.redis.expect("affinity.redis").url;
    let address = url
        .strip_prefix("redis://")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("{url}: redis://host:port/db"));
    let (host, port) = address.split_once(':').expect("host:port");
    let namespace = rendered.roles[0].metadata.namespace.clone().unwrap();
    let service = rendered
        .services
        .iter()
        .find(|s| {
            let name = s.metadata.name.clone().unwrap();
            let ns = s.metadata.namespace.clone().unwrap();
            let in_namespace = ns == namespace && host == name;
            in_namespace
                || [
                    format!("{name}.{ns}"),
                    format!("{name}.{ns}.svc"),
                    format!("{name}.{ns}.svc.cluster.local"),
                ]
                .contains(&host.to_owned())
        })
        .unwrap_or_else(|| panic!("{host}, the host of {url}, is a rendered service"));
    let spec = service.spec.clone().expect("spec");
    let service_port = &spec.ports.expect("ports")[0];
    assert_eq!(
        service_port.port.to_string(),
        port,
        "{url}: the service's port"
    );
    let redis = rendered
        .deployments
        .iter()
        .find(|d| d.metadata.labels == spec.selector)
        .expect("the service selects a rendered deployment");
    let redis_pod = redis.spec.clone().unwrap().template.spec.unwrap();
    let container = &redis_pod.containers[0];
    assert!(
        container.image.as_deref().unwrap().starts_with("redis:"),
        "{:?}",
        container.image
    );
    let target = service_port.target_port.clone().expect("a target port");
    assert!(
        container.ports.iter().flatten().any(|p| match &target {
            IntOrString::String(name) => p.name.as_ref() == Some(name),
            IntOrString::Int(number) => p.container_port == *number,
        }),
        "the service's target port is the redis container's"
    );
    assert_ne!(redis_pod.containers[0].name, pod.containers[0].name);
}

#[test]
fn the_prefill_decode_overlay_serves_its_model_by_pairs() {
    let (_, replicas, router) = fits_together("prefill-decode", &render("overlays/prefill-decode"));
    assert_eq!(replicas, 3);
    for model in &router.models {
        let buckets = model.buckets.as_ref().expect("buckets");
        assert!(!buckets.is_empty());
        for bucket in buckets {
            assert!(bucket.groups.pd.is_some() && bucket.groups.plain.is_none());
        }
    }
    let discovery = router.discovery.kubernetes.expect("pod discovery");
    let roles: Vec<_> = discovery.models.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Some(EngineRole::Prefill), Some(EngineRole::Decode)]);
    assert!(
        discovery.models[0].bootstrap_port.is_some(),
        "prefill pods' bootstrap port"
    );
}

#[test]
fn the_gateway_overlay_serves_the_picker_of_the_inference_pool_it_discovers() {
    let rendered = render("overlays/gateway");
    let (pod, replicas, router) = fits_together("gateway", &rendered);
    assert_eq!(replicas, 3);
    let picker = router.picker.clone().expect("the picker is on").listen;

    // The pool selects the engine pods the base's discovery does, on their port.
    let base = fits_together("base", &render("base")).2;
    let engines = &base.discovery.kubernetes.expect("pod discovery").models[0];
    let [pool] = &rendered.pools[..] else {
        panic!("one InferencePool")
    };
    assert_eq!(
        (pool.api_version.as_str(), pool.kind.as_str()),
        ("inference.networking.k8s.io/v1", "InferencePool")
    );
    assert_eq!(
        pool.spec.selector.match_labels, engines.selector,
        "the pool selects the engine pods"
    );
    let [target] = &pool.spec.target_ports[..] else {
        panic!("one target port")
    };
    assert_eq!(
        target.number,
        i32::from(engines.port),
        "the engines' container port"
    );

    // Discovery follows this pool, in its namespace, for a model of the file, and
    // names no pods by selector.
    let discovery = router.discovery.kubernetes.clone().expect("pod discovery");
    let pool_name = pool.metadata.name.clone().expect("a name");
    assert_eq!(
        discovery.pools,
        [KubernetesPool {
            model: router.models[0].id.clone(),
            name: pool_name.clone(),
        }]
    );
    assert!(discovery.models.is_empty());
    assert_eq!(pool.metadata.namespace, Some(discovery.namespace.clone()));

    // The pool's endpoint picker is the routers' Service, on a port it exposes that
    // reaches the container port the picker listens on, over TLS.
    let picker_ref = &pool.spec.endpoint_picker_ref;
    assert!(picker_ref.group.as_deref().is_none_or(str::is_empty));
    assert!(picker_ref.kind.as_deref().is_none_or(|k| k == "Service"));
    assert_eq!(picker_ref.failure_mode.as_deref(), Some("FailClose"));
    let service = named(&rendered.services, |s| &s.metadata.name, &picker_ref.name);
    assert_eq!(service.metadata.namespace, pool.metadata.namespace);
    let deployment = named(&rendered.deployments, |d| &d.metadata.name, "switchyard");
    assert_eq!(
        service.spec.clone().expect("spec").selector,
        deployment.metadata.labels,
        "the picker's Service selects the router pods"
    );
    let ports = service.spec.clone().expect("spec").ports.expect("ports");
    let service_port = ports
        .iter()
        .find(|p| p.port == picker_ref.port.number)
        .unwrap_or_else(|| panic!("the Service exposes {}", picker_ref.port.number));
    assert_eq!(
        service_port.port,
        i32::from(picker.port()),
        "the picker's Service port is picker.listen's"
    );
    assert!(
        router.picker.as_ref().is_some_and(|p| p.tls.is_some()),
        "the picker serves TLS, as the Inference Extension's gateways expect"
    );
    assert_ne!(
        service_port.app_protocol.as_deref(),
        Some("kubernetes.io/h2c"),
        "not cleartext"
    );
    let container = &pod.containers[0];
    let target = service_port.target_port.clone().expect("a target port");
    let container_port = container
        .ports
        .iter()
        .flatten()
        .find(|p| match &target {
            IntOrString::String(name) => p.name.as_ref() == Some(name),
            IntOrString::Int(number) => p.container_port == *number,
        })
        .expect("the Service's target port is a router container port");
    assert_eq!(
        container_port.container_port,
        i32::from(picker.port()),
        "the picker listens on the container port the Service reaches"
    );

    // Its InferenceObjectives name the pool and order its model's queue: discovery
    // reads them, and the model takes an objective's name from the gateway's header.
    assert!(discovery.objectives, "discovery reads the objectives");
    assert!(!rendered.objectives.is_empty(), "InferenceObjectives");
    let flow = &router.models[0].flow;
    assert_eq!(
        flow.priority.header.as_deref(),
        Some("x-gateway-inference-objective")
    );
    assert!(flow.queue.is_some(), "a queue the objectives order");
    let mut bands = Vec::new();
    for objective in &rendered.objectives {
        assert_eq!(
            (objective.api_version.as_str(), objective.kind.as_str()),
            (
                "inference.networking.x-k8s.io/v1alpha2",
                "InferenceObjective"
            )
        );
        assert_eq!(objective.metadata.namespace, pool.metadata.namespace);
        let pool_ref = &objective.spec.pool_ref;
        assert_eq!(pool_ref.name, pool_name, "the objective names the pool");
        assert!(
            pool_ref
                .group
                .as_deref()
                .is_none_or(|g| g == "inference.networking.k8s.io")
                && pool_ref
                    .kind
                    .as_deref()
                    .is_none_or(|k| k == "InferencePool")
        );
        bands.push(flow.priority.band(objective.spec.priority.unwrap_or(0)));
    }
    bands.sort_unstable();
    bands.dedup();
    assert!(
        bands.len() > 1,
        "the objectives' priorities fall in different bands: {bands:?}"
    );

    // The route sends the gateway's requests to the pool.
    let [route] = &rendered.routes[..] else {
        panic!("one HTTPRoute")
    };
    assert_eq!(
        (route.api_version.as_str(), route.kind.as_str()),
        ("gateway.networking.k8s.io/v1", "HTTPRoute")
    );
    assert_eq!(route.metadata.namespace, pool.metadata.namespace);
    assert!(!route.spec.parent_refs.is_empty(), "attached to a gateway");
    let backends: Vec<&ObjectRef> = route
        .spec
        .rules
        .iter()
        .flat_map(|r| &r.backend_refs)
        .collect();
    let [backend] = &backends[..] else {
        panic!("one backend")
    };
    assert_eq!(
        (
            backend.group.as_deref(),
            backend.kind.as_deref(),
            backend.name.as_str()
        ),
        (
            Some("inference.networking.k8s.io"),
            Some("InferencePool"),
            pool_name.as_str()
        )
    );
    assert!(
        backend.namespace.is_none() || backend.namespace == pool.metadata.namespace,
        "the pool of the route's namespace"
    );
}
