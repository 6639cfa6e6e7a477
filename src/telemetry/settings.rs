//! The trace settings, read from the `OTEL_*` settings (`Config::traces`) as OpenTelemetry's SDKs
//! read them, and checked at start: a setting recast cannot follow stops the start with its
//! reason, rather than leave traces missing without a word.

use std::time::Duration;

use http::{HeaderName, HeaderValue, Uri};

/// The `OTEL_*` settings as they were given.
#[derive(Debug, Clone, Copy)]
pub struct Given<'a> {
    pub endpoint: Option<&'a str>,
    pub traces_endpoint: Option<&'a str>,
    pub headers: Option<&'a str>,
    pub traces_headers: Option<&'a str>,
    pub timeout_ms: u64,
    pub protocol: Option<&'a str>,
    pub certificate: Option<&'a std::path::Path>,
    pub service_name: Option<&'a str>,
    pub resource_attributes: Option<&'a str>,
    pub sampler: &'a str,
    pub sampler_arg: Option<&'a str>,
    pub disabled: bool,
    pub max_queue: usize,
    pub schedule_delay_ms: u64,
    pub max_batch: usize,
}

const OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const OTLP_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
const OTLP_TRACES_HEADERS: &str = "OTEL_EXPORTER_OTLP_TRACES_HEADERS";
const RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
const TRACES_SAMPLER: &str = "OTEL_TRACES_SAMPLER";
const TRACES_SAMPLER_ARG: &str = "OTEL_TRACES_SAMPLER_ARG";
/// The `service.name` when none is given.
pub const DEFAULT_SERVICE_NAME: &str = "recast";

/// What traces do in this process.
#[derive(Debug, Clone)]
pub struct TraceSettings {
    pub sampler: Sampler,
    /// Where spans go; `None`: nowhere (propagation only).
    pub export: Option<ExportSettings>,
}

/// Where and how spans are exported.
#[derive(Debug, Clone)]
pub struct ExportSettings {
    /// The full URL of the collector's traces endpoint.
    pub endpoint: Uri,
    /// Sent with every export (secrets among them: never logged).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub timeout: Duration,
    /// `service.name` first, then `OTEL_RESOURCE_ATTRIBUTES`' pairs.
    pub resource: Vec<(String, String)>,
    pub max_queue: usize,
    pub max_batch: usize,
    pub schedule_delay: Duration,
    /// The PEM file of `OTEL_EXPORTER_OTLP_CERTIFICATE`.
    pub certificate: Option<std::path::PathBuf>,
}

/// Which traces are recorded (OpenTelemetry's `OTEL_TRACES_SAMPLER`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// A caller's `traceparent` decides by its sampled flag.
    pub parent_based: bool,
    /// The share of new traces recorded, 0 to 1, decided by the trace id (so every service that
    /// samples by the same ratio keeps the same traces).
    pub ratio: f64,
}

impl Sampler {
    /// Whether a trace is recorded: by the caller's decision when it sent one and the sampler
    /// follows it, else by the trace id.
    pub fn sampled(&self, parent: Option<bool>, trace_id: &[u8; 16]) -> bool {
        match parent {
            Some(sampled) if self.parent_based => sampled,
            _ => self.takes(trace_id),
        }
    }

    /// The ratio test of OpenTelemetry's `TraceIdRatioBased`: the id's last eight bytes, as a
    /// number, below the ratio of their range.
    fn takes(&self, trace_id: &[u8; 16]) -> bool {
        if self.ratio >= 1.0 {
            return true;
        }
        if self.ratio <= 0.0 {
            return false;
        }
        let mut low = [0u8; 8];
        low.copy_from_slice(&trace_id[8..]);
        let bound = (self.ratio * (1u64 << 63) as f64) as u64;
        (u64::from_be_bytes(low) >> 1) < bound
    }
}

impl TraceSettings {
    /// The settings `given` says, or why recast cannot follow them.
    pub fn read(given: &Given<'_>) -> Result<TraceSettings, String> {
        let sampler = sampler(given.sampler, given.sampler_arg)?;
        if let Some(protocol) = given.protocol
            && protocol.trim() != "http/protobuf"
        {
            return Err(format!(
                "{OTLP_PROTOCOL} is `{protocol}`: recast exports traces over OTLP/HTTP with protobuf only \
                 (`http/protobuf`, usually port 4318)"
            ));
        }
        let endpoint = match (nonempty(given.traces_endpoint), nonempty(given.endpoint)) {
            (Some(traces), _) => Some(endpoint(traces, None, OTLP_TRACES_ENDPOINT)?),
            (None, Some(base)) => Some(endpoint(base, Some("v1/traces"), OTLP_ENDPOINT)?),
            (None, None) => None,
        };
        let Some(endpoint) = endpoint.filter(|_| !given.disabled) else {
            return Ok(TraceSettings { sampler, export: None });
        };
        let mut headers = Vec::new();
        for (setting, value) in [(OTLP_HEADERS, given.headers), (OTLP_TRACES_HEADERS, given.traces_headers)] {
            let Some(value) = value else { continue };
            for (name, text) in pairs(value, setting)? {
                let name = HeaderName::try_from(name.as_str())
                    .map_err(|_| format!("{setting}: `{name}` is not a header name"))?;
                let mut text = HeaderValue::try_from(text)
                    .map_err(|_| format!("{setting}: the value of `{name}` cannot be sent in a header"))?;
                text.set_sensitive(true);
                headers.retain(|(earlier, _)| *earlier != name);
                headers.push((name, text));
            }
        }
        // OTEL_SERVICE_NAME wins over a `service.name` of the attributes, as the SDKs have it.
        let mut resource = vec![("service.name".to_owned(), DEFAULT_SERVICE_NAME.to_owned())];
        if let Some(attributes) = given.resource_attributes {
            for (key, value) in pairs(attributes, RESOURCE_ATTRIBUTES)? {
                resource.retain(|(earlier, _)| *earlier != key);
                resource.push((key, value));
            }
        }
        if let Some(name) = nonempty(given.service_name) {
            resource.retain(|(key, _)| key != "service.name");
            resource.insert(0, ("service.name".to_owned(), name.to_owned()));
        }
        Ok(TraceSettings {
            sampler,
            export: Some(ExportSettings {
                endpoint,
                headers,
                timeout: Duration::from_millis(given.timeout_ms),
                resource,
                max_queue: given.max_queue,
                max_batch: given.max_batch.min(given.max_queue),
                schedule_delay: Duration::from_millis(given.schedule_delay_ms),
                certificate: given.certificate.map(std::path::Path::to_path_buf),
            }),
        })
    }
}

/// `text` without the spaces around it, unless that leaves nothing.
fn nonempty(text: Option<&str>) -> Option<&str> {
    text.map(str::trim).filter(|t| !t.is_empty())
}

/// The sampler a name and its argument say.
fn sampler(name: &str, arg: Option<&str>) -> Result<Sampler, String> {
    let ratio = || -> Result<f64, String> {
        match arg.map(str::trim) {
            None | Some("") => Ok(1.0),
            Some(text) => text.parse::<f64>().ok().filter(|r| (0.0..=1.0).contains(r)).ok_or_else(|| {
                format!("{TRACES_SAMPLER_ARG} is `{text}`: the ratio is a number from 0 to 1")
            }),
        }
    };
    let (parent_based, ratio) = match name.trim() {
        "parentbased_always_on" => (true, 1.0),
        "parentbased_always_off" => (true, 0.0),
        "parentbased_traceidratio" => (true, ratio()?),
        "always_on" => (false, 1.0),
        "always_off" => (false, 0.0),
        "traceidratio" => (false, ratio()?),
        other => {
            return Err(format!(
                "{TRACES_SAMPLER} is `{other}`: recast knows parentbased_always_on, parentbased_always_off, \
                 parentbased_traceidratio, always_on, always_off and traceidratio"
            ));
        }
    };
    Ok(Sampler { parent_based, ratio })
}

/// An endpoint's URL: `http` or `https`, with a host; `append` added to a base URL's path.
fn endpoint(text: &str, append: Option<&str>, setting: &str) -> Result<Uri, String> {
    let url = url::Url::parse(text).map_err(|e| format!("{setting} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(format!(
            "{setting} must be an http or https URL with a host, e.g. http://localhost:4318"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{setting} holds credentials; send them in {OTLP_HEADERS}"));
    }
    let mut url = url;
    if let Some(append) = append {
        let path = url.path().trim_end_matches('/').to_owned();
        url.set_path(&format!("{path}/{append}"));
    }
    url.as_str().parse::<Uri>().map_err(|e| format!("{setting} is not a URL: {e}"))
}

/// `key=value` pairs separated by commas, values percent-decoded (the W3C Baggage form that
/// OpenTelemetry's list settings use); spaces around each part are not part of it.
fn pairs(text: &str, setting: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for member in text.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let Some((key, value)) = member.split_once('=') else {
            return Err(format!("{setting}: `{}` is not `key=value`", shown(member)));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(format!("{setting}: a pair has no key"));
        }
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| format!("{setting}: the value of `{key}` is not UTF-8 once decoded"))?;
        out.push((key.to_owned(), value.into_owned()));
    }
    Ok(out)
}

/// The key of a member only: its value may be a secret.
fn shown(member: &str) -> &str {
    member.split_once('=').map_or(member, |(key, _)| key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::secrets::Secret;

    #[test]
    fn samplers_by_name_and_ratio() {
        let on = sampler("parentbased_always_on", None).unwrap();
        assert!(on.sampled(None, &[0xff; 16]));
        assert!(!on.sampled(Some(false), &[0; 16]), "a caller's decision is followed");
        let always = sampler("always_on", None).unwrap();
        assert!(always.sampled(Some(false), &[0; 16]), "not parent-based: the caller's flag is not asked");
        assert!(!sampler("always_off", None).unwrap().sampled(Some(true), &[0; 16]));
        assert!(sampler("parentbased_always_off", None).unwrap().sampled(Some(true), &[0xff; 16]));
        let tenth = sampler("traceidratio", Some("0.1")).unwrap();
        // The last eight bytes decide: a low number is taken, a high one is not.
        let mut low = [0xffu8; 16];
        low[8..].copy_from_slice(&1u64.to_be_bytes());
        assert!(tenth.sampled(None, &low));
        assert!(!tenth.sampled(None, &[0xff; 16]));
        // About a tenth of spread ids.
        let taken = (0u64..10_000)
            .filter(|n| {
                let mut id = [0u8; 16];
                id[8..].copy_from_slice(&n.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
                tenth.sampled(None, &id)
            })
            .count();
        assert!((800..1200).contains(&taken), "{taken}");
        assert!(sampler("traceidratio", Some("2")).is_err());
        assert!(sampler("traceidratio", Some("half")).is_err());
        let unknown = sampler("jaeger_remote", None).unwrap_err();
        assert!(unknown.contains("OTEL_TRACES_SAMPLER is `jaeger_remote`"), "{unknown}");
    }

    #[test]
    fn endpoints_headers_and_resource() {
        let mut config = Config::default();
        let none = config.traces().unwrap();
        assert!(none.export.is_none(), "no endpoint, no exporter");
        config.otel_exporter_otlp_endpoint = Some("http://collector:4318/".to_owned());
        config.otel_exporter_otlp_headers = Some(Secret::new("api-key=a%20b, x-team = t1"));
        config.otel_exporter_otlp_traces_headers = Some(Secret::new("x-team=t2"));
        config.otel_resource_attributes = Some("deployment.environment.name=prod,team=a%2Cb".to_owned());
        let settings = config.traces().unwrap().export.unwrap();
        assert_eq!(settings.endpoint, "http://collector:4318/v1/traces");
        let headers: Vec<_> =
            settings.headers.iter().map(|(n, v)| (n.as_str(), v.to_str().unwrap())).collect();
        assert_eq!(headers, [("api-key", "a b"), ("x-team", "t2")]);
        assert!(settings.headers.iter().all(|(_, v)| v.is_sensitive()));
        assert_eq!(settings.resource[0], ("service.name".to_owned(), "recast".to_owned()));
        assert_eq!(settings.resource[2], ("team".to_owned(), "a,b".to_owned()));
        config.otel_resource_attributes = Some("service.name=from-attributes".to_owned());
        let named = |config: &Config| config.traces().unwrap().export.unwrap().resource;
        assert_eq!(named(&config), [("service.name".to_owned(), "from-attributes".to_owned())]);
        config.otel_service_name = Some("orders-edge".to_owned());
        assert_eq!(named(&config), [("service.name".to_owned(), "orders-edge".to_owned())]);
        // The traces endpoint is taken as written.
        config.otel_exporter_otlp_traces_endpoint = Some("https://otlp.example/api/traces".to_owned());
        let settings = config.traces().unwrap().export.unwrap();
        assert_eq!(settings.endpoint, "https://otlp.example/api/traces");
        // Disabled: nothing exported.
        config.otel_sdk_disabled = true;
        assert!(config.traces().unwrap().export.is_none());
        config.otel_sdk_disabled = false;
        for (bad, says) in [("grpc", "http/protobuf"), ("http/json", "http/protobuf")] {
            config.otel_exporter_otlp_protocol = Some(bad.to_owned());
            let e = config.traces().unwrap_err();
            assert!(e.contains(says) && e.contains(bad), "{e}");
        }
        config.otel_exporter_otlp_protocol = None;
        config.otel_exporter_otlp_traces_endpoint = Some("ftp://x".to_owned());
        assert!(config.traces().unwrap_err().contains("http or https"));
        config.otel_exporter_otlp_traces_endpoint = Some("http://user:pw@x".to_owned());
        assert!(config.traces().unwrap_err().contains("credentials"));
        config.otel_exporter_otlp_traces_endpoint = None;
        config.otel_exporter_otlp_headers = Some(Secret::new("secret-without-key"));
        assert!(config.traces().unwrap_err().contains("key=value"));
        config.otel_exporter_otlp_headers = Some(Secret::new("bad name=1"));
        assert!(config.traces().unwrap_err().contains("not a header name"));
    }
}
