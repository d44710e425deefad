//! The custom resources' structs (see the parent module's docs for their sources).
use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// `metadata` of a custom resource.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    pub name: String,
    pub namespace: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// A custom resource: type meta, metadata and a spec.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Cr<S> {
    pub api_version: String,
    pub kind: String,
    pub metadata: Meta,
    pub spec: S,
}

// ---- kustomize ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Kustomization {
    pub api_version: String,
    pub kind: String,
    pub resources: Vec<String>,
    #[serde(default)]
    pub components: Vec<String>,
    #[serde(default)]
    pub patches: Vec<Patch>,
    #[serde(default)]
    pub transformers: Vec<String>,
}

/// A kustomize Component (`kustomize.config.k8s.io/v1alpha1`, kustomize
/// `api/types/kustomization.go`: the same fields as a Kustomization; these use two).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Component {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub patches: Vec<Patch>,
}

/// An entry of `patches` (kustomize `api/types/patch.go`): a file, and the objects it applies
/// to.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Patch {
    pub path: String,
    pub target: Option<PatchTarget>,
}

/// `patches[].target` (kustomize `api/types/selector.go`), by kind and name only here.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchTarget {
    pub kind: String,
    pub name: String,
}

/// One operation of a JSON patch file (RFC 6902, as kustomize applies it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonPatchOp {
    pub op: JsonPatchOpKind,
    pub path: String,
    pub value: Option<Value>,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum JsonPatchOpKind {
    Add,
    Remove,
    Replace,
    Test,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamespaceTransformer {
    pub api_version: String,
    pub kind: String,
    pub metadata: Meta,
    #[serde(default)]
    pub unset_only: bool,
    pub set_role_binding_subjects: Option<RoleBindingSubjects>,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum RoleBindingSubjects {
    None,
    DefaultOnly,
    AllServiceAccounts,
}

// ---- InferencePool (inference.networking.k8s.io/v1) ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InferencePoolSpec {
    pub selector: PoolSelector,
    pub target_ports: Vec<PoolPort>,
    pub app_protocol: Option<PoolAppProtocol>,
    pub endpoint_picker_ref: Option<EndpointPickerRef>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolSelector {
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolPort {
    pub number: u16,
}

#[derive(Debug, Deserialize)]
pub enum PoolAppProtocol {
    #[serde(rename = "http")]
    Http,
    #[serde(rename = "kubernetes.io/h2c")]
    H2c,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointPickerRef {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub name: String,
    pub port: Option<PoolPort>,
    pub failure_mode: Option<FailureMode>,
}

#[derive(Debug, Deserialize)]
pub enum FailureMode {
    FailOpen,
    FailClose,
}

// ---- Gateway API (gateway.networking.k8s.io) ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GatewayClassSpec {
    pub controller_name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GatewaySpec {
    pub gateway_class_name: String,
    pub listeners: Vec<Listener>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listener {
    pub name: String,
    pub protocol: String,
    pub port: u16,
    pub hostname: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRouteSpec {
    pub parent_refs: Vec<ParentRef>,
    pub rules: Vec<HttpRouteRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ParentRef {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub name: String,
    pub namespace: Option<String>,
    pub section_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRouteRule {
    #[serde(default)]
    pub matches: Vec<HttpRouteMatch>,
    #[serde(default)]
    pub backend_refs: Vec<BackendRef>,
    pub timeouts: Option<HttpRouteTimeouts>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpRouteMatch {
    pub path: Option<PathMatch>,
    pub method: Option<HttpMethod>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathMatch {
    #[serde(rename = "type")]
    pub type_: PathMatchType,
    pub value: String,
}

#[derive(Debug, Deserialize)]
pub enum PathMatchType {
    Exact,
    PathPrefix,
    RegularExpression,
}

#[derive(Debug, Deserialize)]
#[allow(clippy::upper_case_acronyms)]
pub enum HttpMethod {
    GET,
    HEAD,
    POST,
    PUT,
    DELETE,
    CONNECT,
    OPTIONS,
    TRACE,
    PATCH,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendRef {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub name: String,
    pub namespace: Option<String>,
    pub port: Option<u16>,
    pub weight: Option<i32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRouteTimeouts {
    pub request: Option<String>,
    pub backend_request: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceGrantSpec {
    pub from: Vec<GrantFrom>,
    pub to: Vec<GrantTo>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantFrom {
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantTo {
    pub group: String,
    pub kind: String,
    pub name: Option<String>,
}

// ---- Envoy Gateway (gateway.envoyproxy.io/v1alpha1) ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetRef {
    pub group: String,
    pub kind: String,
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EnvoyExtensionPolicySpec {
    pub target_refs: Vec<TargetRef>,
    pub ext_proc: Vec<ExtProc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtProc {
    pub backend_refs: Vec<ExtProcBackendRef>,
    pub fail_open: Option<bool>,
    pub message_timeout: Option<String>,
    pub processing_mode: Option<ExtProcProcessingMode>,
    pub metadata: Option<ExtProcMetadata>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtProcBackendRef {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub name: String,
    pub namespace: Option<String>,
    pub port: Option<u16>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtProcProcessingMode {
    pub request: Option<ProcessingModeOptions>,
    pub response: Option<ProcessingModeOptions>,
    pub allow_mode_override: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessingModeOptions {
    pub body: Option<BodyMode>,
    pub attributes: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
pub enum BodyMode {
    Streamed,
    Buffered,
    BufferedPartial,
    FullDuplexStreamed,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtProcMetadata {
    pub accessible_namespaces: Option<Vec<String>>,
    pub writable_namespaces: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EnvoyPatchPolicySpec {
    pub target_ref: TargetRef,
    #[serde(rename = "type")]
    pub type_: String,
    pub json_patches: Vec<JsonPatch>,
    pub priority: Option<i32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonPatch {
    #[serde(rename = "type")]
    pub type_: String,
    pub name: String,
    pub operation: JsonPatchOperation,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JsonPatchOperation {
    pub op: String,
    pub path: Option<String>,
    pub json_path: Option<String>,
    pub from: Option<String>,
    /// Envoy's own configuration (not checked here: Envoy checks it, and
    /// `ext-proc/tests/e2e.rs` runs its shape).
    pub value: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientTrafficPolicySpec {
    pub target_refs: Vec<TargetRef>,
    pub connection: Option<ClientConnection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientConnection {
    pub buffer_limit: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendTrafficPolicySpec {
    pub target_refs: Vec<TargetRef>,
    pub circuit_breaker: Option<CircuitBreaker>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CircuitBreaker {
    pub max_connections: Option<i64>,
    pub max_pending_requests: Option<i64>,
    pub max_parallel_requests: Option<i64>,
}

// ---- Gateway API BackendTLSPolicy (gateway.networking.k8s.io/v1) ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendTlsPolicySpec {
    pub target_refs: Vec<SectionTargetRef>,
    pub validation: BackendTlsValidation,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SectionTargetRef {
    pub group: String,
    pub kind: String,
    pub name: String,
    pub section_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendTlsValidation {
    #[serde(default)]
    pub ca_certificate_refs: Vec<LocalObjectRef>,
    pub well_known_ca_certificates: Option<String>,
    pub hostname: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalObjectRef {
    pub group: String,
    pub kind: String,
    pub name: String,
}

// ---- cert-manager (cert-manager.io/v1) ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IssuerSpec {
    pub self_signed: Option<SelfSignedIssuer>,
    pub ca: Option<CaIssuer>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelfSignedIssuer {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CaIssuer {
    pub secret_name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CertificateSpec {
    pub secret_name: String,
    pub common_name: Option<String>,
    #[serde(default)]
    pub dns_names: Vec<String>,
    #[serde(default, rename = "isCA")]
    pub is_ca: bool,
    #[serde(default)]
    pub usages: Vec<KeyUsage>,
    pub duration: Option<String>,
    pub renew_before: Option<String>,
    pub private_key: Option<CertificatePrivateKey>,
    pub issuer_ref: IssuerRef,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
pub enum KeyUsage {
    #[serde(rename = "digital signature")]
    DigitalSignature,
    #[serde(rename = "key encipherment")]
    KeyEncipherment,
    #[serde(rename = "cert sign")]
    CertSign,
    #[serde(rename = "server auth")]
    ServerAuth,
    #[serde(rename = "client auth")]
    ClientAuth,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CertificatePrivateKey {
    pub algorithm: Option<KeyAlgorithm>,
    pub size: Option<u32>,
    pub encoding: Option<KeyEncoding>,
    pub rotation_policy: Option<RotationPolicy>,
}

#[derive(Debug, Deserialize)]
#[allow(clippy::upper_case_acronyms)]
pub enum KeyAlgorithm {
    RSA,
    ECDSA,
    Ed25519,
}

#[derive(Debug, Deserialize)]
#[allow(clippy::upper_case_acronyms)]
pub enum KeyEncoding {
    PKCS1,
    PKCS8,
}

#[derive(Debug, Deserialize)]
pub enum RotationPolicy {
    Never,
    Always,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerRef {
    pub name: String,
    pub kind: Option<String>,
    pub group: Option<String>,
}

// ---- Istio DestinationRule (networking.istio.io/v1) ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DestinationRuleSpec {
    pub host: String,
    pub traffic_policy: Option<TrafficPolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficPolicy {
    pub tls: Option<ClientTlsSettings>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientTlsSettings {
    pub mode: IstioTlsMode,
    pub sni: Option<String>,
    pub insecure_skip_verify: Option<bool>,
    pub credential_name: Option<String>,
    pub subject_alt_names: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
#[allow(clippy::upper_case_acronyms)]
pub enum IstioTlsMode {
    DISABLE,
    SIMPLE,
    MUTUAL,
    #[serde(rename = "ISTIO_MUTUAL")]
    IstioMutual,
}
