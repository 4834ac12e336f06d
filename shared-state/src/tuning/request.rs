//! The `tuning` object of this driver's opaque claim config:
//!
//! ```yaml
//! parameters:
//!   apiVersion: v1alpha1
//!   tuning:
//!     irqs: isolate            # or default
//!     cfsQuota: off            # or default
//!     loadBalancing: off       # or default
//!     idle: {maxLatencyMicroseconds: 0}   # or default
//!     governor: performance    # or default
//! ```
//!
//! Every key is optional; an unknown key or value is refused with its path
//! (`tuning.idle.maxLatency`), so a typo never passes as "no tuning". A key
//! left out leaves the knob to an earlier config (the DeviceClass's);
//! `default` sets it back (a [`TuningRequest`] keeps the difference).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest cpufreq governor name the kernel keeps (`CPUFREQ_NAME_LEN` is 16
/// with the terminating NUL).
pub const MAX_GOVERNOR_LEN: usize = 15;

/// The largest resume latency the kernel takes from user space: its
/// "no constraint" value (`S32_MAX`) is refused on writes.
pub const MAX_IDLE_LATENCY_US: u32 = i32::MAX as u32 - 1;

/// What a claim asks of its CPUs beyond exclusivity. The default asks
/// nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tuning {
    /// Device interrupts kept off the claim's CPUs while it is prepared.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub isolate_irqs: bool,
    /// No CFS bandwidth limit on the claim's containers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cfs_quota_off: bool,
    /// The scheduler does not balance load onto or off the claim's CPUs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub load_balancing_off: bool,
    /// The longest wake-up latency, in microseconds, the claim's CPUs may
    /// idle into (0: no idle state with any exit latency).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_idle_latency_us: Option<u32>,
    /// The cpufreq governor of the claim's CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub governor: Option<String>,
}

impl Tuning {
    /// Whether the claim asks for nothing.
    pub fn is_empty(&self) -> bool {
        *self == Tuning::default()
    }

    /// Whether any knob of the node (interrupts, idle states, frequency)
    /// is asked for, as opposed to knobs of the claim's containers only.
    pub fn touches_node(&self) -> bool {
        self.isolate_irqs || self.max_idle_latency_us.is_some() || self.governor.is_some()
    }

    /// The knobs asked for, by their config names, for logs and messages.
    pub fn knobs(&self) -> Vec<&'static str> {
        let mut knobs = Vec::new();
        if self.isolate_irqs {
            knobs.push("irqs");
        }
        if self.cfs_quota_off {
            knobs.push("cfsQuota");
        }
        if self.load_balancing_off {
            knobs.push("loadBalancing");
        }
        if self.max_idle_latency_us.is_some() {
            knobs.push("idle");
        }
        if self.governor.is_some() {
            knobs.push("governor");
        }
        knobs
    }
}

/// A `tuning` object as written: each knob asked for (`Some` of its
/// value, `Some` of the default for `default`) or left out (`None`), so a
/// later config (the claim's) can set back a knob an earlier one (its
/// DeviceClass's) asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TuningRequest {
    pub isolate_irqs: Option<bool>,
    pub cfs_quota_off: Option<bool>,
    pub load_balancing_off: Option<bool>,
    pub max_idle_latency_us: Option<Option<u32>>,
    pub governor: Option<Option<String>>,
}

impl TuningRequest {
    /// `later` laid over `self`: each knob `later` names wins, `default`
    /// included, as a claim's config wins over its DeviceClass's.
    pub fn overlaid(&self, later: &TuningRequest) -> TuningRequest {
        TuningRequest {
            isolate_irqs: later.isolate_irqs.or(self.isolate_irqs),
            cfs_quota_off: later.cfs_quota_off.or(self.cfs_quota_off),
            load_balancing_off: later.load_balancing_off.or(self.load_balancing_off),
            max_idle_latency_us: later.max_idle_latency_us.or(self.max_idle_latency_us),
            governor: later.governor.clone().or_else(|| self.governor.clone()),
        }
    }

    /// The tuning asked for in the end: a knob left out asks nothing.
    pub fn tuning(&self) -> Tuning {
        Tuning {
            isolate_irqs: self.isolate_irqs.unwrap_or(false),
            cfs_quota_off: self.cfs_quota_off.unwrap_or(false),
            load_balancing_off: self.load_balancing_off.unwrap_or(false),
            max_idle_latency_us: self.max_idle_latency_us.flatten(),
            governor: self.governor.clone().flatten(),
        }
    }
}

/// Why a `tuning` object was refused; each names the key at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TuningError {
    #[error("{path} is not an object")]
    NotAnObject { path: String },
    #[error("unknown key {path} (known: {known})")]
    UnknownKey { path: String, known: &'static str },
    #[error("{path}: {value} is not one of {allowed}")]
    BadValue {
        path: String,
        value: String,
        allowed: &'static str,
    },
}

fn bad(path: &str, value: &Value, allowed: &'static str) -> TuningError {
    TuningError::BadValue {
        path: path.to_string(),
        value: value.to_string(),
        allowed,
    }
}

fn keyed_object<'a>(
    path: &str,
    value: &'a Value,
    known: &'static [&'static str],
    listed: &'static str,
) -> Result<&'a serde_json::Map<String, Value>, TuningError> {
    let object = value.as_object().ok_or_else(|| TuningError::NotAnObject {
        path: path.to_string(),
    })?;
    if let Some(key) = object.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(TuningError::UnknownKey {
            path: format!("{path}.{key}"),
            known: listed,
        });
    }
    Ok(object)
}

/// `off` (true) or `default` (false) of a switch key.
fn switch(path: &str, value: &Value, on: &'static str) -> Result<bool, TuningError> {
    const ALLOWED_OFF: &str = "\"off\", \"default\"";
    const ALLOWED_ISOLATE: &str = "\"isolate\", \"default\"";
    let allowed = if on == "isolate" {
        ALLOWED_ISOLATE
    } else {
        ALLOWED_OFF
    };
    match value.as_str() {
        Some(text) if text == on => Ok(true),
        Some("default") => Ok(false),
        _ => Err(bad(path, value, allowed)),
    }
}

/// Reads the `tuning` object of a config's parameters. `path` names it in
/// errors (`tuning`).
pub fn parse_tuning(path: &str, value: &Value) -> Result<TuningRequest, TuningError> {
    let object = keyed_object(
        path,
        value,
        &["irqs", "cfsQuota", "loadBalancing", "idle", "governor"],
        "irqs, cfsQuota, loadBalancing, idle, governor",
    )?;
    let mut request = TuningRequest::default();
    for (key, value) in object {
        let path = format!("{path}.{key}");
        match key.as_str() {
            "irqs" => request.isolate_irqs = Some(switch(&path, value, "isolate")?),
            "cfsQuota" => request.cfs_quota_off = Some(switch(&path, value, "off")?),
            "loadBalancing" => request.load_balancing_off = Some(switch(&path, value, "off")?),
            "idle" if value.as_str() == Some("default") => {
                request.max_idle_latency_us = Some(None);
            }
            "idle" => {
                let idle = keyed_object(
                    &path,
                    value,
                    &["maxLatencyMicroseconds"],
                    "maxLatencyMicroseconds",
                )
                .map_err(|e| match e {
                    TuningError::NotAnObject { .. } => {
                        bad(&path, value, "{maxLatencyMicroseconds: N}, \"default\"")
                    }
                    other => other,
                })?;
                // `{}` names no bound: as if the key were left out.
                if let Some(latency) = idle.get("maxLatencyMicroseconds") {
                    let us = latency
                        .as_u64()
                        .and_then(|us| u32::try_from(us).ok())
                        .filter(|us| *us <= MAX_IDLE_LATENCY_US)
                        .ok_or_else(|| {
                            bad(
                                &format!("{path}.maxLatencyMicroseconds"),
                                latency,
                                "the whole numbers 0 to 2147483646",
                            )
                        })?;
                    request.max_idle_latency_us = Some(Some(us));
                }
            }
            "governor" if value.as_str() == Some("default") => request.governor = Some(None),
            "governor" => {
                let name = value
                    .as_str()
                    .filter(|name| {
                        !name.is_empty()
                            && name.len() <= MAX_GOVERNOR_LEN
                            && name
                                .bytes()
                                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                    })
                    .ok_or_else(|| {
                        bad(
                            &path,
                            value,
                            "a cpufreq governor name (lower-case letters, digits, _; at most 15), \"default\"",
                        )
                    })?;
                request.governor = Some(Some(name.to_string()));
            }
            // `object` refused every other key.
            _ => {}
        }
    }
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parse_table() {
        let all = Tuning {
            isolate_irqs: true,
            cfs_quota_off: true,
            load_balancing_off: true,
            max_idle_latency_us: Some(0),
            governor: Some("performance".into()),
        };
        let cases: Vec<(&str, Value, Result<Tuning, String>)> = vec![
            ("empty asks nothing", json!({}), Ok(Tuning::default())),
            (
                "every knob",
                json!({"irqs": "isolate", "cfsQuota": "off", "loadBalancing": "off",
                       "idle": {"maxLatencyMicroseconds": 0}, "governor": "performance"}),
                Ok(all),
            ),
            (
                "default values ask nothing",
                json!({"irqs": "default", "cfsQuota": "default", "loadBalancing": "default",
                       "idle": "default", "governor": "default"}),
                Ok(Tuning::default()),
            ),
            (
                "an empty idle asks nothing",
                json!({"idle": {}}),
                Ok(Tuning::default()),
            ),
            (
                "a bounded latency",
                json!({"idle": {"maxLatencyMicroseconds": 20}}),
                Ok(Tuning {
                    max_idle_latency_us: Some(20),
                    ..Tuning::default()
                }),
            ),
            (
                "unknown top key",
                json!({"irq": "isolate"}),
                Err("unknown key tuning.irq (known: irqs, cfsQuota, loadBalancing, idle, governor)".into()),
            ),
            (
                "unknown nested key",
                json!({"idle": {"maxLatency": 3}}),
                Err("unknown key tuning.idle.maxLatency (known: maxLatencyMicroseconds)".into()),
            ),
            (
                "unknown value",
                json!({"irqs": "off"}),
                Err("tuning.irqs: \"off\" is not one of \"isolate\", \"default\"".into()),
            ),
            (
                "a bool is not a value",
                json!({"cfsQuota": false}),
                Err("tuning.cfsQuota: false is not one of \"off\", \"default\"".into()),
            ),
            (
                "negative latency",
                json!({"idle": {"maxLatencyMicroseconds": -1}}),
                Err("tuning.idle.maxLatencyMicroseconds: -1 is not one of the whole numbers 0 to 2147483646".into()),
            ),
            (
                "the kernel's no-constraint value",
                json!({"idle": {"maxLatencyMicroseconds": 2147483647u64}}),
                Err("tuning.idle.maxLatencyMicroseconds: 2147483647 is not one of the whole numbers 0 to 2147483646".into()),
            ),
            (
                "a path in a governor",
                json!({"governor": "../x"}),
                Err("tuning.governor: \"../x\" is not one of a cpufreq governor name (lower-case letters, digits, _; at most 15), \"default\"".into()),
            ),
            (
                "not an object",
                json!("isolate"),
                Err("tuning is not an object".into()),
            ),
            (
                "idle not an object",
                json!({"idle": 0}),
                Err("tuning.idle: 0 is not one of {maxLatencyMicroseconds: N}, \"default\"".into()),
            ),
        ];
        for (name, input, want) in cases {
            let got = parse_tuning("tuning", &input)
                .map(|request| request.tuning())
                .map_err(|e| e.to_string());
            assert_eq!(got, want, "{name}");
        }
    }

    fn request(value: Value) -> TuningRequest {
        parse_tuning("tuning", &value).expect("a valid tuning")
    }

    #[test]
    fn a_later_config_wins_knob_by_knob() {
        let class = request(
            json!({"irqs": "isolate", "idle": {"maxLatencyMicroseconds": 100},
                                   "governor": "powersave"}),
        );
        let claim = request(json!({"idle": {"maxLatencyMicroseconds": 0}, "cfsQuota": "off"}));
        assert_eq!(
            class.overlaid(&claim).tuning(),
            Tuning {
                isolate_irqs: true,
                cfs_quota_off: true,
                load_balancing_off: false,
                max_idle_latency_us: Some(0),
                governor: Some("powersave".into()),
            }
        );
        assert_eq!(
            TuningRequest::default().overlaid(&claim).tuning(),
            claim.tuning()
        );
    }

    /// `default` in the claim sets back what its DeviceClass asked; a key
    /// the claim leaves out keeps the class's. Control: without the
    /// claim's config every knob of the class stands.
    #[test]
    fn a_later_default_sets_a_knob_back() {
        let class = request(
            json!({"irqs": "isolate", "cfsQuota": "off", "loadBalancing": "off",
                                   "idle": {"maxLatencyMicroseconds": 0}, "governor": "performance"}),
        );
        let every_knob = Tuning {
            isolate_irqs: true,
            cfs_quota_off: true,
            load_balancing_off: true,
            max_idle_latency_us: Some(0),
            governor: Some("performance".into()),
        };
        assert_eq!(class.tuning(), every_knob);
        assert_eq!(
            class.overlaid(&TuningRequest::default()).tuning(),
            every_knob
        );
        let all_back = request(json!({"irqs": "default", "cfsQuota": "default",
                                      "loadBalancing": "default", "idle": "default",
                                      "governor": "default"}));
        assert_eq!(class.overlaid(&all_back).tuning(), Tuning::default());
        let some_back = request(json!({"cfsQuota": "default", "governor": "default"}));
        assert_eq!(
            class.overlaid(&some_back).tuning(),
            Tuning {
                cfs_quota_off: false,
                governor: None,
                ..every_knob
            }
        );
    }

    #[test]
    fn the_stored_form_reads_back_and_omits_what_is_not_asked() {
        let tuning = Tuning {
            isolate_irqs: true,
            max_idle_latency_us: Some(0),
            ..Tuning::default()
        };
        let text = serde_json::to_string(&tuning).expect("serialise");
        assert_eq!(text, r#"{"isolateIrqs":true,"maxIdleLatencyUs":0}"#);
        assert_eq!(
            serde_json::from_str::<Tuning>(&text).expect("read back"),
            tuning
        );
        assert_eq!(
            serde_json::to_string(&Tuning::default()).expect("serialise"),
            "{}"
        );
    }
}
