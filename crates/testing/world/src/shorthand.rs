//! The endpoint shorthand every test writes: one line per endpoint of a slice.

use serde_json::{Value, json};

use crate::{NODE, OTHER_NODE};

/// One endpoint of an EndpointSlice, as JSON, from a shorthand: the address, then words.
///
/// - Conditions: `ready` (ready, hence serving), `serving`, `terminating` name the
///   conditions that hold; the others are false. Without any of them the endpoint is ready
///   and serving, the API's defaults. `notready` says that none holds. So
///   `"10.0.0.2 serving terminating"` is a pod shutting down gracefully, and
///   `"10.0.0.2 terminating"` one that no longer serves.
/// - `local`: on this node ([`NODE`]); otherwise on [`OTHER_NODE`].
/// - `hint-zone=Z`, `hint-node=N`: topology hints (repeatable).
///
/// An unknown word panics: a typo must not turn into a different endpoint.
pub fn ep(spec: &str) -> Value {
    let endpoint = Shorthand::parse(spec);
    let mut object = json!({
        "addresses": [endpoint.address],
        "nodeName": if endpoint.local { NODE } else { OTHER_NODE },
        "conditions": {"ready": endpoint.ready, "serving": endpoint.serving,
                       "terminating": endpoint.terminating},
    });
    if !endpoint.zone_hints.is_empty() || !endpoint.node_hints.is_empty() {
        let names = |names: &[&str]| -> Vec<Value> { names.iter().map(|n| json!({"name": n})).collect() };
        object["hints"] = json!({"forZones": names(&endpoint.zone_hints),
                                 "forNodes": names(&endpoint.node_hints)});
    }
    object
}

/// [`ep`] of each shorthand, in order.
pub fn eps(specs: &[&str]) -> Vec<Value> {
    specs.iter().map(|spec| ep(spec)).collect()
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Shorthand<'a> {
    address: &'a str,
    ready: bool,
    serving: bool,
    terminating: bool,
    local: bool,
    zone_hints: Vec<&'a str>,
    node_hints: Vec<&'a str>,
}

impl<'a> Shorthand<'a> {
    fn parse(spec: &'a str) -> Self {
        let mut words = spec.split_whitespace();
        let mut endpoint = Shorthand {
            address: words
                .next()
                .expect("an endpoint shorthand starts with its address"),
            ..Shorthand::default()
        };
        let mut conditions_given = false;
        for word in words {
            let mut condition = |flag: &mut bool| {
                *flag = true;
                conditions_given = true;
            };
            match word {
                "ready" => {
                    condition(&mut endpoint.ready);
                    endpoint.serving = true;
                }
                "serving" => condition(&mut endpoint.serving),
                "terminating" => condition(&mut endpoint.terminating),
                "notready" => conditions_given = true,
                "local" => endpoint.local = true,
                _ => {
                    if let Some(zone) = word.strip_prefix("hint-zone=") {
                        endpoint.zone_hints.push(zone);
                    } else if let Some(node) = word.strip_prefix("hint-node=") {
                        endpoint.node_hints.push(node);
                    } else {
                        panic!("unknown word {word:?} in endpoint shorthand {spec:?}");
                    }
                }
            }
        }
        if !conditions_given {
            (endpoint.ready, endpoint.serving) = (true, true);
        }
        endpoint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conditions(spec: &str) -> (bool, bool, bool) {
        let e = Shorthand::parse(spec);
        (e.ready, e.serving, e.terminating)
    }

    #[test]
    fn conditions_default_to_ready_and_otherwise_are_the_words_given() {
        assert_eq!(conditions("10.0.0.1"), (true, true, false));
        assert_eq!(conditions("10.0.0.1 local"), (true, true, false));
        assert_eq!(conditions("10.0.0.1 ready"), (true, true, false));
        assert_eq!(conditions("10.0.0.1 serving terminating"), (false, true, true));
        assert_eq!(conditions("10.0.0.1 terminating"), (false, false, true));
        assert_eq!(conditions("10.0.0.1 notready"), (false, false, false));
        assert_eq!(conditions("10.0.0.1 ready terminating"), (true, true, true));
    }

    #[test]
    fn locality_and_hints_become_the_slice_fields() {
        let json = ep("10.0.0.1 local hint-zone=z1 hint-node=node-a hint-zone=");
        assert_eq!(json["nodeName"], NODE);
        assert_eq!(json["hints"]["forZones"], json!([{"name": "z1"}, {"name": ""}]));
        assert_eq!(json["hints"]["forNodes"], json!([{"name": "node-a"}]));
        let remote = ep("10.0.0.1");
        assert_eq!(remote["nodeName"], OTHER_NODE);
        assert!(remote.get("hints").is_none(), "{remote}");
    }

    #[test]
    #[should_panic(expected = "unknown word \"termintaing\"")]
    fn a_typo_is_refused() {
        ep("10.0.0.1 termintaing");
    }
}
