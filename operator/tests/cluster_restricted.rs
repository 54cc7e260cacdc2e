//! The server pods pass Pod Security "restricted" admission on a real control plane, with the
//! operator binary running (scripts/operator-it.sh runs these with `--ignored`): each sample and
//! an McpServer that sets every pod template and tuning field produce a Deployment whose pod
//! template the API server admits in a namespace that enforces the restricted profile (a
//! server-side dry-run create of a Pod from it: PodSecurity admission runs on dry runs). What
//! would leave the profile is refused when the McpServer is created; sysctls outside the safe
//! set need a namespace that enforces no profile, and this shows it.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use quiver_operator::crd::McpServer;
use serde_json::{Value, json};

mod common;

use common::*;

/// Labels `ns` to enforce the Pod Security `level` (restricted, baseline, privileged).
async fn enforce(client: &Client, ns: &str, level: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let patch = json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": level,
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}});
    api.patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    // PodSecurity admission reads namespaces from a cache: wait until it applies `level`, or a
    // pod admitted a moment later would say nothing. A pod on the host network is what the
    // baseline and restricted levels refuse and the privileged level admits.
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {"name": "pod-security-probe"},
        "spec": {"hostNetwork": true, "containers": [{"name": "probe", "image": "probe"}]},
    }))
    .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let refusal = format!("PodSecurity \"{level}:latest\"");
    eventually(30, &format!("admission enforcing {level}"), || async {
        match pods.create(&params, &probe).await {
            Ok(_) => (level == "privileged").then_some(()),
            Err(e) => (level != "privileged" && e.to_string().contains(&refusal)).then_some(()),
        }
    })
    .await;
}

/// Waits for the namespace's `default` ServiceAccount (made by the controller-manager after
/// the namespace): pods that name no account are refused until it exists.
async fn default_service_account(ns: &TempNs) {
    let api = ns.api::<ServiceAccount>();
    eventually(60, "the default ServiceAccount", || async {
        api.get_opt("default").await.ok().flatten()
    })
    .await;
}

/// The Deployment the operator applied for `name`, once it exists.
async fn deployment(ns: &TempNs, name: &str) -> Deployment {
    let api = ns.api::<Deployment>();
    eventually(60, &format!("Deployment {name}"), || async {
        api.get_opt(name).await.ok().flatten()
    })
    .await
}

/// A server-side dry-run create of a Pod from `d`'s template in namespace `ns`.
async fn admit(client: &Client, ns: &str, d: &Deployment) -> Result<(), String> {
    let template = d.spec.clone().unwrap().template;
    let mut meta = template.metadata.unwrap_or_default();
    meta.name = Some(format!("{}-dry-run", d.name_any()));
    meta.namespace = Some(ns.to_owned());
    let pod = Pod {
        metadata: meta,
        spec: template.spec,
        status: None,
    };
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&params, &pod)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Names of the objects of `kind` in a sample.
fn names(yaml: &str, kind: &str) -> Vec<String> {
    yaml.split("\n---\n")
        .filter_map(|doc| serde_saphyr::from_str::<Value>(doc).ok())
        .filter(|v| v["kind"] == kind)
        .map(|v| v["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn every_sample_makes_pods_the_restricted_profile_admits() {
    with_ns("q-restricted-samples", |ns| async move {
        enforce(&ns.client, &ns.name, "restricted").await;
        default_service_account(&ns).await;
        let dir = format!("{}/../deploy/samples", env!("CARGO_MANIFEST_DIR"));
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|f| f.ends_with(".yaml"))
            .collect();
        files.sort();
        let mut checked = 0;
        for file in files {
            let yaml = sample(&file);
            let servers = names(&yaml, "McpServer");
            if servers.is_empty() {
                continue;
            }
            ns.apply_yaml(&yaml).await;
            // The sample's own Deployments (e.g. an upstream) and the operator's.
            for name in names(&yaml, "Deployment").into_iter().chain(servers) {
                let d = deployment(&ns, &name).await;
                if let Err(e) = admit(&ns.client, &ns.name, &d).await {
                    panic!("{file}: the pods of {name} are not admitted: {e}");
                }
                checked += 1;
            }
        }
        assert!(checked >= 9, "every sample's pods were checked ({checked})");
    })
    .await;
}

/// An McpServer that sets every field of `podTemplate` and `tuning` (within the profile).
fn everything(name: &str, sa: &str, priority: &str) -> Value {
    json!({
        "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "image": "quiver-server:dev",
            "imagePullPolicy": "IfNotPresent",
            "tools": [{"name": "add", "handler": {"builtin": "add"}}],
            "upstreams": [{"name": "github", "stdio": {
                "image": "registry.example/github-mcp:1", "command": ["/bin/github-mcp", "stdio"],
                "env": {"GITHUB_TOKEN": "{{secret.github.token}}", "LOG": "warn"}, "cwd": "/work"},
                "tools": {"prefix": "gh_"}}],
            "resources": {"limits": {"memory": "256Mi"}},
            "auth": {"bearerTokenSecretRef": {"name": "clients", "key": "tokens"}},
            "networkPolicy": {"mcpFrom": [{"podSelector": {}}]},
            "tuning": {
                "profile": "throughput", "cpuPinning": true, "cpus": 1, "allocator": "system",
                "workerThreads": 1, "sysctls": {"net.ipv4.tcp_keepalive_time": "30"},
            },
            "podTemplate": {
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "mcp", "effect": "NoSchedule"}],
                "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                    "weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": name}}}}]}},
                "labels": {"team": "agents"},
                "annotations": {
                    "container.apparmor.security.beta.kubernetes.io/server": "runtime/default",
                    "example.com/note": "x",
                },
                "imagePullSecrets": [{"name": "regcred"}],
                "serviceAccountName": sa,
                "env": [
                    {"name": "PLAIN", "value": "1"},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "app", "key": "k", "optional": true}}},
                ],
                "envFrom": [{"configMapRef": {"name": "settings", "optional": true}}],
                "volumes": [
                    {"name": "a", "configMap": {"name": "scripts", "optional": true}},
                    {"name": "b", "secret": {"secretName": "data", "optional": true}},
                    {"name": "c", "emptyDir": {"sizeLimit": "10Mi"}},
                    {"name": "d", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "vault", "expirationSeconds": 600}}]}},
                    {"name": "e", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                    {"name": "f", "persistentVolumeClaim": {"claimName": "data", "readOnly": true}},
                    {"name": "g", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}},
                    {"name": "h", "csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": true}},
                ],
                "volumeMounts": [
                    {"name": "a", "mountPath": "/opt/tools", "readOnly": true},
                    {"name": "b", "mountPath": "/etc/data", "subPath": "x"},
                    {"name": "c", "mountPath": "/scratch", "mountPropagation": "None"},
                    {"name": "d", "mountPath": "/var/run/vault"},
                    {"name": "e", "mountPath": "/etc/podinfo"},
                    {"name": "f", "mountPath": "/data"},
                    {"name": "g", "mountPath": "/cache"},
                    {"name": "h", "mountPath": "/mnt/secrets"},
                ],
                "priorityClassName": priority,
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": name}}}],
                "security": {
                    "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000, "supplementalGroups": [3000],
                    "seccompLocalhostProfile": "profiles/quiver.json",
                    "seLinuxOptions": {"type": "container_t", "level": "s0:c123,c456"},
                },
            },
        },
    })
}

fn mcp_api(ns: &TempNs) -> Api<DynamicObject> {
    Api::namespaced_with(ns.client.clone(), &ns.name, &ApiResource::erase::<McpServer>(&()))
}

async fn create(ns: &TempNs, obj: &Value) -> Result<(), String> {
    let obj: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
    mcp_api(ns)
        .create(&PostParams::default(), &obj)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn every_pod_template_field_stays_within_the_restricted_profile() {
    with_ns("q-restricted-all", |ns| async move {
        enforce(&ns.client, &ns.name, "restricted").await;
        let priority = format!("{}-high", ns.name);
        let classes: Api<PriorityClass> = Api::all(ns.client.clone());
        let pc: PriorityClass =
            serde_json::from_value(json!({"metadata": {"name": priority}, "value": 1000})).unwrap();
        let _ = classes.create(&PostParams::default(), &pc).await;
        // The ServiceAccount's owner lets this McpServer run as it.
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "identity",
            "annotations": {"quiver.dev/allowed-mcpservers": "other, everything"}}}))
        .unwrap();
        ns.api::<ServiceAccount>()
            .create(&PostParams::default(), &sa)
            .await
            .unwrap();
        create(&ns, &everything("everything", "identity", &priority))
            .await
            .unwrap();
        let d = deployment(&ns, "everything").await;
        let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("identity"));
        assert_eq!(
            pod.volumes.as_ref().unwrap().len(),
            8 + 3 + 1 + 1,
            "the spec's, the sidecar's (binary, socket, /tmp), the server's scratch space and the token"
        );
        assert_eq!(pod.containers.len(), 2, "server and sidecar");
        let admitted = admit(&ns.client, &ns.name, &d).await;
        let _ = classes.delete(&priority, &DeleteParams::default()).await;
        admitted.unwrap_or_else(|e| panic!("the pods are not admitted: {e}"));

        // Sysctls outside the safe set: the restricted (and baseline) profile refuses the
        // pods; only a namespace that enforces no profile admits them.
        let mut unsafe_ = everything("tuned", "identity", "");
        unsafe_["spec"]["podTemplate"]
            .as_object_mut()
            .unwrap()
            .remove("priorityClassName");
        unsafe_["spec"]["podTemplate"]
            .as_object_mut()
            .unwrap()
            .remove("serviceAccountName");
        unsafe_["spec"]["tuning"]["unsafeSysctls"] = json!({"net.core.somaxconn": "4096"});
        create(&ns, &unsafe_).await.unwrap();
        let d = deployment(&ns, "tuned").await;
        let refused = admit(&ns.client, &ns.name, &d).await.unwrap_err();
        assert!(
            refused.contains("forbidden sysctls") && refused.contains("net.core.somaxconn"),
            "{refused}"
        );
        enforce(&ns.client, &ns.name, "baseline").await;
        let refused = admit(&ns.client, &ns.name, &d).await.unwrap_err();
        assert!(refused.contains("baseline"), "{refused}");
        enforce(&ns.client, &ns.name, "privileged").await;
        admit(&ns.client, &ns.name, &d).await.unwrap();
    })
    .await;
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn escapes_from_the_profile_are_refused_when_the_mcpserver_is_created() {
    with_ns("q-restricted-cel", |ns| async move {
        let base = |pod_template: Value| {
            json!({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "bad"},
                   "spec": {"tools": [{"name": "add", "handler": {"builtin": "add"}}], "podTemplate": pod_template}})
        };
        let cases = [
            (base(json!({"volumes": [{"name": "host", "hostPath": {"path": "/proc"}}]})), "a volume sets exactly one of"),
            (base(json!({"volumes": [{"name": "n", "nfs": {"server": "x", "path": "/"}}]})), "a volume sets exactly one of"),
            (base(json!({"volumes": [{"name": "two", "emptyDir": {}, "secret": {"secretName": "s"}}]})), "a volume sets exactly one of"),
            (base(json!({"security": {"seLinuxOptions": {"type": "spc_t"}}})), "Unsupported value: \"spc_t\""),
            (base(json!({"annotations": {"container.apparmor.security.beta.kubernetes.io/server": "unconfined"}})), "AppArmor and seccomp annotations"),
            (base(json!({"volumes": [{"name": "c", "emptyDir": {}}], "volumeMounts": [{"name": "c", "mountPath": "/x", "mountPropagation": "Bidirectional"}]})), "mountPropagation other than None"),
            (base(json!({"priorityClassName": "system-node-critical"})), "system- PriorityClasses"),
            (base(json!({"serviceAccountName": "Not/A/Name"})), "should match"),
            (json!({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "bad"},
                    "spec": {"ingress": {"host": "h.example", "annotations": {"nginx.ingress.kubernetes.io/server-snippet": "location / {}"}}}}),
             "-snippet"),
            (json!({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "bad"},
                    "spec": {"ingress": {"host": "h.example", "annotations": {"NGINX.org/Location-Snippets": "return 200;"}}}}),
             "raw configuration"),
            (json!({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "bad"},
                    "spec": {"ingress": {"host": "h.example", "annotations": {"haproxy-ingress.github.io/config-backend": "http-request deny"}}}}),
             "raw configuration"),
        ];
        for (i, (obj, expected)) in cases.iter().enumerate() {
            let err = create(&ns, obj).await.expect_err("the API server must refuse it");
            assert!(err.contains(expected), "case {i}: {err}");
        }
        // A user or role in seLinuxOptions is not part of the schema: dropped, never applied.
        create(&ns, &base(json!({"security": {"seLinuxOptions": {"type": "container_t", "user": "system_u", "role": "system_r"}}})))
            .await
            .unwrap();
        let stored = mcp_api(&ns).get("bad").await.unwrap();
        assert_eq!(
            stored.data["spec"]["podTemplate"]["security"]["seLinuxOptions"],
            json!({"type": "container_t"})
        );
    })
    .await;
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_service_account_without_its_owners_consent_is_an_invalid_spec() {
    with_ns("q-restricted-sa", |ns| async move {
        let spec = |sa: Option<&str>| {
            let mut v = json!({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "borrower"},
                   "spec": {"tools": [{"name": "add", "handler": {"builtin": "add"}}]}});
            if let Some(sa) = sa {
                v["spec"]["podTemplate"] = json!({"serviceAccountName": sa});
            }
            v
        };
        create(&ns, &spec(None)).await.unwrap();
        let before = deployment(&ns, "borrower").await;
        assert_eq!(
            before.spec.as_ref().unwrap().template.spec.as_ref().unwrap().service_account_name.as_deref(),
            Some("borrower")
        );
        // The namespace's `default` ServiceAccount has not consented.
        let obj: DynamicObject = serde_json::from_value(spec(Some("default"))).unwrap();
        mcp_api(&ns)
            .patch("borrower", &PatchParams::apply("quiver-tests").force(), &Patch::Apply(&obj))
            .await
            .unwrap();
        let (reason, message) = ns.wait_condition("borrower", "ConfigValid", "False", 30).await;
        assert_eq!(reason, "ServiceAccountNotAllowed", "{message}");
        assert!(message.contains("ServiceAccount default"), "{message}");
        let events: Api<k8s_openapi::api::core::v1::Event> = ns.api();
        eventually(30, "a ServiceAccountNotAllowed event", || async {
            events
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .any(|e| e.reason.as_deref() == Some("ServiceAccountNotAllowed"))
                .then_some(())
        })
        .await;
        // The pods keep running as before, and the Role stays bound to Quiver's own account.
        let after = ns.api::<Deployment>().get("borrower").await.unwrap();
        assert_eq!(after.spec, before.spec);
        let rb = ns
            .api::<k8s_openapi::api::rbac::v1::RoleBinding>()
            .get("borrower-config-reader")
            .await
            .unwrap();
        assert_eq!(rb.subjects.unwrap()[0].name, "borrower");
    })
    .await;
}
