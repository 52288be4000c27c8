//! `deploy/kubernetes`: every manifest is read into its Kubernetes API type and must
//! come back out field for field (a misspelt or misplaced field, which the types
//! would drop, fails here), and the pieces fit: the role lets the routers watch
//! pods, the deployment runs under that service account with the config map's file,
//! and that file is a router configuration.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// The manifest `name`, as its type; panics when the type does not hold all of it.
fn read<T: DeserializeOwned + Serialize>(name: &str) -> T {
    let text = std::fs::read_to_string(manifests().join(name)).expect("the manifest");
    let written: Value = serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    let typed: T =
        serde_json::from_value(written.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let read_back = serde_json::to_value(&typed).expect("serializes");
    assert_eq!(read_back, written, "{name}: a field its type does not know");
    typed
}

#[test]
fn every_manifest_is_its_type_field_for_field_and_they_fit_together() {
    let mut files: Vec<String> = std::fs::read_dir(manifests())
        .expect("deploy/kubernetes")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "configmap.yaml",
            "deployment.yaml",
            "role.yaml",
            "rolebinding.yaml",
            "service.yaml",
            "serviceaccount.yaml"
        ],
        "each manifest is checked below"
    );
    let account: ServiceAccount = read("serviceaccount.yaml");
    let role: Role = read("role.yaml");
    let binding: RoleBinding = read("rolebinding.yaml");
    let config: ConfigMap = read("configmap.yaml");
    let deployment: Deployment = read("deployment.yaml");
    let service: Service = read("service.yaml");

    let rules = role.rules.expect("rules");
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["pods".to_owned()][..])
    );
    assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
    assert_eq!(binding.role_ref.name, role.metadata.name.clone().unwrap());
    let subjects = binding.subjects.expect("subjects");
    assert_eq!(subjects[0].name, account.metadata.name.clone().unwrap());

    let pod = deployment
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod spec");
    assert_eq!(pod.service_account_name, account.metadata.name);
    let container = &pod.containers[0];
    let args = container.args.clone().expect("args");
    assert_eq!(
        args[..3],
        ["serve", "--config", "/etc/switchyard/router.yaml"]
    );
    let volume = &pod.volumes.expect("volumes")[0];
    assert_eq!(
        volume.config_map.as_ref().map(|c| c.name.clone()),
        Some(config.metadata.name.clone().unwrap())
    );
    assert_eq!(
        service.spec.expect("spec").selector,
        deployment.metadata.labels,
        "the service selects the router pods"
    );

    let router_yaml = &config.data.expect("data")["router.yaml"];
    let router =
        router_config::RouterConfig::from_yaml(router_yaml).expect("a router configuration");
    let kubernetes = router.discovery.kubernetes.clone().expect("pod discovery");
    assert_eq!(
        Some(kubernetes.namespace),
        role.metadata.namespace,
        "it watches the namespace the role is for"
    );
    router_http::ValidatedConfig::validate(router).expect("a valid configuration");
}
