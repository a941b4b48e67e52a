use std::path::Path;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_model::{ObjectKind, RejectReason, Rejection};

use super::{FileObjects, ParsedFile, parse_manifest};
use crate::manifests::object::{ManifestObject, ObjectKey};

const FIXTURE: &str = include_str!("../../../tests/fixtures/web-service.yaml");

fn parse_at(path: &str, text: &str) -> FileObjects {
    match parse_manifest(Path::new(path), text.as_bytes(), Some("worker-1")) {
        ParsedFile::Documents(file) => file,
        ParsedFile::Malformed(rejection) => panic!("unexpectedly malformed: {rejection}"),
    }
}

fn parse(text: &str) -> FileObjects {
    parse_at("/m/a.yaml", text)
}

fn malformed(path: &str, text: &str) -> Rejection {
    match parse_manifest(Path::new(path), text.as_bytes(), None) {
        ParsedFile::Malformed(rejection) => rejection,
        ParsedFile::Documents(file) => panic!("parsed: {file:?}"),
    }
}

fn keys(file: &FileObjects) -> Vec<String> {
    file.objects.keys().map(ToString::to_string).collect()
}

fn service<'a>(file: &'a FileObjects, namespace: &str, name: &str) -> &'a Service {
    match file
        .objects
        .get(&ObjectKey::new(ObjectKind::Service, namespace, name))
    {
        Some(ManifestObject::Service(service)) => service,
        other => panic!("no Service {namespace}/{name}: {other:?}"),
    }
}

fn slice<'a>(file: &'a FileObjects, namespace: &str, name: &str) -> &'a EndpointSlice {
    match file
        .objects
        .get(&ObjectKey::new(ObjectKind::EndpointSlice, namespace, name))
    {
        Some(ManifestObject::EndpointSlice(slice)) => slice,
        other => panic!("no EndpointSlice {namespace}/{name}: {other:?}"),
    }
}

fn only_rejection(file: &FileObjects) -> &Rejection {
    assert_eq!(file.rejections.len(), 1, "{:?}", file.rejections);
    &file.rejections[0]
}

// === Accepted input ===

#[test]
fn kubectl_list_fixture_loads_service_and_slice() {
    let file = parse(FIXTURE);
    assert!(file.rejections.is_empty(), "{:?}", file.rejections);
    assert_eq!(keys(&file), ["Service shop/web", "EndpointSlice shop/web-8xk2p"]);
    let web = service(&file, "shop", "web");
    let spec = web.spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.41.7"));
    assert_eq!(spec.ports.as_ref().unwrap()[1].port, 9090);
    let slice = slice(&file, "shop", "web-8xk2p");
    let endpoints = slice.endpoints.as_deref().unwrap();
    assert_eq!(endpoints.len(), 2);
    assert_eq!(endpoints[1].addresses, ["10.244.2.31"]);
    assert_eq!(
        slice.metadata.labels.as_ref().unwrap()["kubernetes.io/service-name"],
        "web"
    );
}

#[test]
fn multi_document_yaml_skips_empty_documents_and_other_kinds() {
    let file = parse(
        "---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {replicas: 3}\n\
         ---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 80}]}\n\
         ---\n\
         ---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata: {a: b}\n\
         ---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1}\naddressType: IPv4\nendpoints: []\n\
         ---\n",
    );
    assert!(file.rejections.is_empty(), "{:?}", file.rejections);
    assert_eq!(
        keys(&file),
        ["Service default/web", "EndpointSlice default/web-1"]
    );
}

#[test]
fn missing_namespace_means_default_also_inside_the_object() {
    let file = parse("apiVersion: v1\nkind: Service\nmetadata: {name: web}\n");
    assert_eq!(
        service(&file, "default", "web").metadata.namespace.as_deref(),
        Some("default")
    );
    let file = parse("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: \"\"}\n");
    assert_eq!(keys(&file), ["Service default/web"]);
}

#[test]
fn json_files_hold_one_object_or_a_stream() {
    let one = r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "x"}}"#;
    assert_eq!(keys(&parse_at("/m/a.json", one)), ["Service x/a"]);
    let stream = format!(
        "{one}\n{}",
        r#"{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "a-1", "namespace": "x"}, "addressType": "IPv6", "endpoints": []}"#
    );
    assert_eq!(
        keys(&parse_at("/m/a.json", &stream)),
        ["Service x/a", "EndpointSlice x/a-1"]
    );
}

#[test]
fn json_list_as_kubectl_writes_it() {
    let list = r#"{
        "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
        "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "x"}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "x"}}
        ]
    }"#;
    let file = parse_at("/m/list.json", list);
    assert!(file.rejections.is_empty(), "{:?}", file.rejections);
    assert_eq!(keys(&file), ["Service x/a"]);
}

#[test]
fn typed_lists_lend_kind_and_api_version_to_their_items() {
    let file = parse(
        "apiVersion: v1\nkind: ServiceList\nitems:\n\
         - metadata: {name: a}\n\
         - metadata: {name: b, namespace: x}\n\
         ---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSliceList\nitems:\n\
         - metadata: {name: a-1}\n  addressType: IPv4\n  endpoints: []\n\
         ---\n\
         apiVersion: v1\nkind: NodeList\nitems:\n- metadata: {name: worker-1}\n- metadata: {name: worker-2}\n",
    );
    assert!(file.rejections.is_empty(), "{:?}", file.rejections);
    assert_eq!(
        keys(&file),
        [
            "Service default/a",
            "Service x/b",
            "EndpointSlice default/a-1",
            "Node worker-1"
        ]
    );
}

#[test]
fn empty_list_and_empty_file_define_nothing() {
    assert!(
        parse("apiVersion: v1\nkind: List\nitems: []\n")
            .objects
            .is_empty()
    );
    assert!(parse("apiVersion: v1\nkind: List\n").objects.is_empty());
    let empty = parse("");
    assert!(empty.objects.is_empty() && empty.rejections.is_empty());
    let comments = parse("# nothing here yet\n");
    assert!(comments.objects.is_empty() && comments.rejections.is_empty());
}

#[test]
fn only_this_nodes_node_is_kept() {
    let nodes = "apiVersion: v1\nkind: Node\nmetadata: {name: worker-1, labels: {topology.kubernetes.io/zone: a}}\n\
                 ---\n\
                 apiVersion: v1\nkind: Node\nmetadata: {name: worker-2}\nspec: oops\n";
    let file = parse(nodes);
    // worker-2 is not ours: neither kept nor even decoded, so its bad spec is no concern.
    assert!(file.rejections.is_empty(), "{:?}", file.rejections);
    assert_eq!(keys(&file), ["Node worker-1"]);
    match parse_manifest(Path::new("/m/n.yaml"), nodes.as_bytes(), None) {
        ParsedFile::Documents(file) => assert!(file.objects.is_empty()),
        ParsedFile::Malformed(r) => panic!("{r}"),
    }
}

#[test]
fn same_object_twice_in_one_file_keeps_the_later_document() {
    let file = parse(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.0.0.1}\n\
         ---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.0.0.2}\n",
    );
    let spec = service(&file, "default", "web").spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.0.0.2"));
}

// === Rejected input ===

#[test]
fn invalid_yaml_makes_the_whole_file_malformed_with_position() {
    let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\nkind: [unclosed\n";
    let rejection = malformed("/m/broken.yaml", text);
    assert_eq!(rejection.kind, ObjectKind::Manifest);
    assert_eq!(rejection.object, "/m/broken.yaml");
    assert_eq!(rejection.reason, RejectReason::Malformed);
    assert!(
        rejection.field.starts_with("document 2 (line "),
        "{}",
        rejection.field
    );
}

#[test]
fn invalid_json_names_line_and_column() {
    let rejection = malformed("/m/a.json", "{\"kind\": \"Service\",\n  \"metadata\": }");
    assert_eq!(rejection.field, "document 1 (line 2, column 15)");
    assert_eq!(rejection.reason, RejectReason::Malformed);
}

#[test]
fn a_wrongly_typed_field_rejects_only_its_document_with_the_field_path() {
    let file = parse(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\n\
         spec: {ports: [{port: 80}, {port: \"abc\"}]}\n\
         ---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: ok}\n",
    );
    assert_eq!(keys(&file), ["Service default/ok"]);
    let rejection = only_rejection(&file);
    assert_eq!(rejection.kind, ObjectKind::Service);
    assert_eq!(rejection.object, "shop/web");
    assert_eq!(rejection.field, "spec.ports[1].port");
    assert_eq!(rejection.reason, RejectReason::Malformed);
    assert!(
        rejection.detail.contains("/m/a.yaml, document 1"),
        "{}",
        rejection.detail
    );
    assert!(
        file.failed
            .contains(&ObjectKey::new(ObjectKind::Service, "shop", "web"))
    );
}

#[test]
fn a_spec_that_is_not_an_object_is_named() {
    let file = parse("apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: just-a-string\n");
    assert!(file.objects.is_empty());
    assert_eq!(only_rejection(&file).field, "spec");
}

#[test]
fn slice_errors_name_the_nested_field() {
    let file = parse(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s}\naddressType: IPv4\n\
         endpoints: [{addresses: [10.0.0.1]}, {addresses: 10.0.0.2}]\n",
    );
    let rejection = only_rejection(&file);
    assert_eq!(rejection.field, "endpoints[1].addresses");
    assert_eq!(rejection.object, "default/s");
}

#[test]
fn documents_without_identity_are_rejected_as_manifest_documents() {
    let cases = [
        ("apiVersion: v1\nmetadata: {name: a}\n", "document 1: kind"),
        ("kind: Service\nmetadata: {name: a}\n", "document 1: apiVersion"),
        (
            "apiVersion: v1\nkind: Service\nspec: {}\n",
            "document 1: metadata.name",
        ),
        (
            "apiVersion: v1\nkind: Service\nmetadata: {name: 7}\n",
            "document 1: metadata.name",
        ),
        (
            "apiVersion: v1\nkind: List\nitems:\n- kind: Service\n  metadata: {name: a}\n",
            "document 1, items[0]: apiVersion",
        ),
    ];
    for (text, field) in cases {
        let file = parse(text);
        assert!(file.objects.is_empty(), "{text}");
        let rejection = only_rejection(&file);
        assert_eq!(rejection.kind, ObjectKind::Manifest, "{text}");
        assert_eq!(rejection.object, "/m/a.yaml", "{text}");
        assert_eq!(rejection.field, field, "{text}");
        assert_eq!(rejection.reason, RejectReason::MissingField, "{text}");
    }
}

#[test]
fn documents_that_are_not_objects_are_rejected() {
    let file = parse("just a string\n---\n- a\n- list\n---\napiVersion: v1\nkind: List\nitems: {}\n");
    let fields: Vec<_> = file.rejections.iter().map(|r| r.field.as_str()).collect();
    assert_eq!(fields, ["document 1", "document 2", "document 3: items"]);
    assert!(
        file.rejections
            .iter()
            .all(|r| r.reason == RejectReason::Malformed)
    );
}

#[test]
fn an_unsupported_api_version_is_refused_clearly() {
    let file = parse(
        "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: s, namespace: x}\naddressType: IPv4\nendpoints: []\n",
    );
    assert!(file.objects.is_empty());
    let rejection = only_rejection(&file);
    assert_eq!(rejection.kind, ObjectKind::EndpointSlice);
    assert_eq!(rejection.object, "x/s");
    assert_eq!(rejection.field, "apiVersion");
    assert_eq!(rejection.reason, RejectReason::InvalidValue);
    assert!(
        rejection
            .detail
            .contains("\"discovery.k8s.io/v1beta1\" is not supported, use \"discovery.k8s.io/v1\""),
        "{}",
        rejection.detail
    );
    assert!(
        file.failed
            .contains(&ObjectKey::new(ObjectKind::EndpointSlice, "x", "s"))
    );
}

#[test]
fn a_bad_list_item_does_not_hide_the_others() {
    let file = parse(
        "apiVersion: v1\nkind: List\nitems:\n\
         - {apiVersion: v1, kind: Service, metadata: {name: a}, spec: {ports: [{port: x}]}}\n\
         - {apiVersion: v1, kind: Service, metadata: {name: b}}\n",
    );
    assert_eq!(keys(&file), ["Service default/b"]);
    let rejection = only_rejection(&file);
    assert_eq!(rejection.field, "spec.ports[0].port");
    assert!(
        rejection.detail.contains("document 1, items[0]"),
        "{}",
        rejection.detail
    );
}

#[test]
fn a_later_good_document_settles_an_earlier_failure() {
    let file = parse(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: 1\n\
         ---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: web}\n",
    );
    assert_eq!(keys(&file), ["Service default/web"]);
    assert!(file.failed.is_empty());
    assert_eq!(file.rejections.len(), 1);
}

// === Hostile files ===

#[test]
fn a_file_that_is_not_utf8_is_refused_whole() {
    let mut bytes = b"apiVersion: v1\nkind: Service\nmetadata: {name: web}\n# caf".to_vec();
    let offset = bytes.len();
    bytes.extend([0xE9, b'\n']); // Latin-1 "é"
    for path in ["/m/latin1.yaml", "/m/latin1.json"] {
        let rejection = match parse_manifest(Path::new(path), &bytes, None) {
            ParsedFile::Malformed(rejection) => rejection,
            ParsedFile::Documents(file) => panic!("parsed: {file:?}"),
        };
        assert_eq!(
            (rejection.object.as_str(), rejection.field.as_str()),
            (path, "file")
        );
        assert_eq!(rejection.reason, RejectReason::Malformed);
        let expected = format!("not UTF-8 text (invalid byte at offset {offset})");
        assert!(rejection.detail.contains(&expected), "{rejection}");
    }
}

#[test]
fn the_classic_billion_laughs_is_refused() {
    let mut text = String::from("lol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for level in 1..10 {
        let aliases = vec![format!("*l{}", level - 1); 9].join(", ");
        text.push_str(&format!("lol{level}: &l{level} [{aliases}]\n"));
    }
    let rejection = malformed("/m/laughs.yaml", &text);
    assert_eq!(rejection.reason, RejectReason::Malformed);
    assert!(
        rejection.detail.contains("repetition limit exceeded") || rejection.detail.contains("expands"),
        "{rejection}"
    );
}

/// `items`, a list of `n` values, and `more`, a list of `n` aliases of it: n² values.
fn quadratic_bomb(n: usize) -> String {
    format!(
        "items: &a [{}]\nmore: [{}]\n",
        vec!["1"; n].join(","),
        vec!["*a"; n].join(",")
    )
}

#[test]
fn a_quadratic_alias_bomb_is_refused_by_the_budget() {
    // serde_yaml_ng's own guard counts alias jumps, not what they expand to: 20,000 aliases
    // of a 20,000-item list are few jumps for a document of 40,000 events, but 400 million
    // values.
    let text = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\n{}",
        quadratic_bomb(20_000)
    );
    let rejection = malformed("/m/bomb.yaml", &text);
    assert_eq!(rejection.reason, RejectReason::Malformed);
    assert!(
        rejection
            .detail
            .contains("expands to far more than its file's size"),
        "{rejection}"
    );
}

#[test]
fn serde_yaml_ng_alone_would_expand_a_quadratic_bomb() {
    // Why the budget exists: the same shape, small enough to expand here (a million values
    // from 6 KB), passes serde_yaml_ng's own alias guard, and is refused by ours.
    let n = 1000;
    let text = quadratic_bomb(n);
    let expanded: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
    let total: usize = expanded["more"]
        .as_array()
        .unwrap()
        .iter()
        .map(|list| list.as_array().unwrap().len())
        .sum();
    assert_eq!(total, n * n);
    let rejection = malformed("/m/bomb.yaml", &text);
    assert!(
        rejection
            .detail
            .contains("expands to far more than its file's size"),
        "{rejection}"
    );
}

#[test]
fn a_few_aliases_in_an_ordinary_file_still_work() {
    let text = "apiVersion: v1\nkind: Service\nmetadata: {name: web, labels: &labels {app: web, tier: front}}\n\
                spec: {clusterIP: 10.96.0.10, ports: [{port: 80}], selector: *labels}\n";
    let file = parse(text);
    assert!(file.rejections.is_empty(), "{:?}", file.rejections);
    let spec = service(&file, "default", "web").spec.as_ref().unwrap();
    assert_eq!(spec.selector.as_ref().unwrap()["tier"], "front");
}

#[test]
fn deep_nesting_is_refused_in_yaml_and_json() {
    let depth = 1000;
    let yaml = format!("a: {}{}\n", "[".repeat(depth), "]".repeat(depth));
    let rejection = malformed("/m/deep.yaml", &yaml);
    assert!(
        rejection.detail.contains("recursion limit exceeded"),
        "{rejection}"
    );
    let json = format!("{{\"a\": {}{}}}", "[".repeat(depth), "]".repeat(depth));
    let rejection = malformed("/m/deep.json", &json);
    assert!(
        rejection.detail.contains("recursion limit exceeded"),
        "{rejection}"
    );
}

#[test]
fn objects_remember_where_in_the_file_they_were_defined() {
    let file = parse(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: skipped}\n\
         ---\n\
         apiVersion: v1\nkind: List\nitems:\n\
         - {apiVersion: v1, kind: Service, metadata: {name: a}}\n\
         - {apiVersion: v1, kind: Service, metadata: {name: b}}\n",
    );
    let placement = |name: &str| {
        let key = ObjectKey::new(ObjectKind::Service, "default", name);
        let placement = &file.placements[&key];
        (placement.ordinal, placement.label.clone())
    };
    assert_eq!(placement("a"), (0, "document 2, items[0]".to_owned()));
    assert_eq!(placement("b"), (1, "document 2, items[1]".to_owned()));
}

#[test]
fn service_cidrs_are_cluster_scoped_and_read_from_lists_too() {
    let file = parse(
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\n\
         metadata: {name: kubernetes, namespace: ignored}\nspec: {cidrs: [10.96.0.0/16]}\n\
         ---\n\
         apiVersion: networking.k8s.io/v1\nkind: ServiceCIDRList\nitems:\n\
         - metadata: {name: extra}\n  spec: {cidrs: [fd00:96::/112]}\n\
         ---\n\
         apiVersion: networking.k8s.io/v1beta1\nkind: ServiceCIDR\nmetadata: {name: old}\nspec: {cidrs: [10.97.0.0/16]}\n",
    );
    assert_eq!(keys(&file), ["ServiceCIDR extra", "ServiceCIDR kubernetes"]);
    let key = ObjectKey::new(ObjectKind::ServiceCidr, "", "kubernetes");
    match file.objects.get(&key) {
        Some(ManifestObject::ServiceCidr(object)) => {
            let cidrs = object.spec.as_ref().and_then(|s| s.cidrs.clone());
            assert_eq!(cidrs, Some(vec!["10.96.0.0/16".to_string()]));
        }
        other => panic!("no ServiceCIDR kubernetes: {other:?}"),
    }
    let refused = only_rejection(&file);
    assert_eq!(
        (refused.kind, refused.object.as_str(), refused.field.as_str()),
        (ObjectKind::ServiceCidr, "old", "apiVersion")
    );
}

/// Items are read one at a time (`stream`): those naming their own type are decoded at
/// once, those leaning on the list's wait for the list's `kind`, which JSON writes last.
/// Whatever the order of reading, objects count and win in file order.
#[test]
fn list_items_keep_file_order_whether_decoded_at_once_or_after_the_list_kind() {
    let list = r#"{
        "apiVersion": "v1",
        "items": [
            {"metadata": {"name": "a"}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b"}},
            {"metadata": {"name": "a"}, "spec": {"type": "NodePort"}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "c"}, "spec": "bad"}
        ],
        "kind": "ServiceList"
    }"#;
    let file = parse_at("/m/list.json", list);
    assert_eq!(keys(&file), ["Service default/a", "Service default/b"]);
    let a = service(&file, "default", "a");
    assert_eq!(a.spec.as_ref().and_then(|s| s.type_.as_deref()), Some("NodePort"));
    let placement = |name: &str| {
        let placement = &file.placements[&ObjectKey::new(ObjectKind::Service, "default", name)];
        (placement.ordinal, placement.label.clone())
    };
    assert_eq!(placement("b"), (1, "document 1, items[1]".to_owned()));
    assert_eq!(placement("a"), (2, "document 1, items[2]".to_owned()));
    let refused = only_rejection(&file);
    assert_eq!(
        (refused.object.as_str(), refused.field.as_str()),
        ("default/c", "spec")
    );
    assert!(
        file.failed
            .contains(&ObjectKey::new(ObjectKind::Service, "default", "c"))
    );
}

/// Only lists lend their items: the items of any other document count for nothing, and
/// the document is what its own kind says.
#[test]
fn items_of_a_document_that_is_not_a_list_are_ignored() {
    let yaml = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n\
                items:\n- {apiVersion: v1, kind: Service, metadata: {name: hidden}}\n\
                ---\n\
                apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n\
                items:\n- {apiVersion: v1, kind: Service, metadata: {name: hidden-too}, spec: 1}\n\
                ---\n\
                items:\n- {apiVersion: v1, kind: Service, metadata: {name: no-kind-above}}\n";
    let file = parse(yaml);
    assert_eq!(keys(&file), ["Service default/a"]);
    let refused = only_rejection(&file);
    assert_eq!(
        (refused.kind, refused.field.as_str()),
        (ObjectKind::Manifest, "document 3: kind")
    );
}

/// `items` that is not a list is refused in a list and ignored elsewhere, also when a
/// later `items` key replaces an earlier list.
#[test]
fn a_list_whose_items_are_not_a_list_is_refused() {
    let file = parse_at(
        "/m/l.json",
        r#"{"apiVersion": "v1", "items": [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}}],
            "items": "replaced", "kind": "List"}"#,
    );
    assert!(file.objects.is_empty(), "{:?}", keys(&file));
    let refused = only_rejection(&file);
    assert_eq!(refused.field, "document 1: items");
    assert!(
        refused.detail.contains("expected a list, found a string"),
        "{}",
        refused.detail
    );
}

/// `parse_and_store` validates each document as it is decoded; it must come to exactly what
/// `parse_manifest` then `validate_file` come to, also when one object has several documents
/// of which only some are valid (only the one that counts is reported).
#[test]
fn storing_while_parsing_equals_parsing_then_validating() {
    use crate::manifests::object::Stored;
    use crate::manifests::validate::{ValidationRules, validate_file};

    let service = |name: &str, port: u32, ip: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\n\
             spec: {{clusterIP: {ip}, ports: [{{port: {port}}}]}}\n"
        )
    };
    let documents = [
        service("ok", 80, "10.0.0.1"),
        service("later-invalid", 80, "10.0.0.2"),
        service("later-invalid", 0, "10.0.0.2"),
        service("earlier-invalid", 0, "10.0.0.3"),
        service("earlier-invalid", 81, "10.0.0.3"),
        service("only-invalid", 80, "not-an-ip"),
        "apiVersion: v9\nkind: Service\nmetadata: {name: ok}\n".to_owned(),
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: listed}\n  \
         spec: {clusterIP: 10.0.0.9, ports: [{port: 90}]}\n"
            .to_owned(),
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, labels: {kubernetes.io/service-name: ok}}\n\
         addressType: IPv4\nendpoints: [{addresses: [10.1.0.1]}]\n"
            .to_owned(),
        "apiVersion: v1\nkind: Node\nmetadata: {name: worker-1}\n".to_owned(),
        "just a string\n".to_owned(),
    ];
    let text = documents.join("---\n");
    let path = Path::new("/m/a.yaml");
    let rules = ValidationRules::default();
    let mut expected = parse_at("/m/a.yaml", &text);
    validate_file(path, &mut expected, &rules);
    let ParsedFile::Documents(stored) =
        super::parse_and_store(path, text.as_bytes(), Some("worker-1"), &rules)
    else {
        panic!("malformed");
    };
    assert_eq!(
        stored.objects.keys().collect::<Vec<_>>(),
        expected.objects.keys().collect::<Vec<_>>()
    );
    for (key, object) in &expected.objects {
        assert!(
            Stored::of(object).unwrap().same_content(&stored.objects[key]),
            "{key}"
        );
    }
    assert_eq!(stored.placements, expected.placements);
    assert_eq!(stored.failed, expected.failed);
    assert_eq!(stored.rejections, expected.rejections);
    // The fixture exercises what it claims to.
    let mut names: Vec<&str> = expected.objects.keys().map(|k| &*k.id.name).collect();
    names.sort_unstable();
    assert_eq!(names, ["earlier-invalid", "listed", "ok", "s", "worker-1"]);
    assert!(expected.failed.iter().any(|k| &*k.id.name == "later-invalid"));
    assert!(expected.failed.iter().any(|k| &*k.id.name == "only-invalid"));
    assert!(!expected.failed.iter().any(|k| &*k.id.name == "earlier-invalid"));
}
