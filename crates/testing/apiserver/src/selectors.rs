//! Label and field selectors as the API server parses and applies them to lists and watches.
//!
//! Pure: parsing a selector string and testing one object. The grammar follows the API
//! conventions: comma means AND; labels support `=`, `==`, `!=`, `in (..)`, `notin (..)`,
//! `key`, `!key`, `>` and `<`; fields support `=`, `==` and `!=` on the labels a type
//! declares, with `\,`, `\=` and `\\` escapes in values.

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::resources::ResourceType;

/// A parsed `labelSelector` (all requirements must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelRequirement {
    Exists(String),
    NotExists(String),
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    GreaterThan(String, i64),
    LessThan(String, i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    Not,
    Equals,
    DoubleEquals,
    NotEquals,
    Open,
    Close,
    Comma,
    Greater,
    Less,
}

impl LabelSelector {
    /// Parses a selector; the empty string selects everything.
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        let tokens = tokenize(text)?;
        let mut parser = Parser {
            tokens,
            position: 0,
            text,
        };
        let mut requirements = Vec::new();
        while !parser.at_end() {
            requirements.push(parser.requirement()?);
            match parser.next() {
                None | Some(Token::Comma) => {}
                Some(other) => return Err(parser.error(&format!("unexpected {other:?} after a requirement"))),
            }
        }
        Ok(LabelSelector { requirements })
    }

    /// True when the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let empty = Map::new();
        let labels = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        self.requirements
            .iter()
            .all(|requirement| requirement.matches(labels))
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

impl LabelRequirement {
    fn matches(&self, labels: &Map<String, Value>) -> bool {
        let value = |key: &str| labels.get(key).and_then(Value::as_str);
        let number = |key: &str| value(key).and_then(|v| v.parse::<i64>().ok());
        match self {
            LabelRequirement::Exists(key) => labels.contains_key(key),
            LabelRequirement::NotExists(key) => !labels.contains_key(key),
            LabelRequirement::Equals(key, wanted) => value(key) == Some(wanted.as_str()),
            LabelRequirement::NotEquals(key, unwanted) => value(key) != Some(unwanted.as_str()),
            LabelRequirement::In(key, set) => value(key).is_some_and(|v| set.iter().any(|s| s == v)),
            LabelRequirement::NotIn(key, set) => !value(key).is_some_and(|v| set.iter().any(|s| s == v)),
            LabelRequirement::GreaterThan(key, bound) => number(key).is_some_and(|n| n > *bound),
            LabelRequirement::LessThan(key, bound) => number(key).is_some_and(|n| n < *bound),
        }
    }
}

fn tokenize(text: &str) -> Result<Vec<Token>, ApiError> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let token = match c {
            c if c.is_whitespace() => continue,
            '!' if chars.peek() == Some(&'=') => {
                chars.next();
                Token::NotEquals
            }
            '!' => Token::Not,
            '=' if chars.peek() == Some(&'=') => {
                chars.next();
                Token::DoubleEquals
            }
            '=' => Token::Equals,
            '(' => Token::Open,
            ')' => Token::Close,
            ',' => Token::Comma,
            '>' => Token::Greater,
            '<' => Token::Less,
            c if is_word_char(c) => {
                let mut word = String::from(c);
                while let Some(&next) = chars.peek().filter(|n| is_word_char(**n)) {
                    word.push(next);
                    chars.next();
                }
                Token::Word(word)
            }
            other => {
                return Err(ApiError::BadRequest(format!(
                    "unable to parse requirement: invalid character {other:?} in label selector {text:?}"
                )));
            }
        };
        tokens.push(token);
    }
    Ok(tokens)
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

struct Parser<'a> {
    tokens: Vec<Token>,
    position: usize,
    text: &'a str,
}

impl Parser<'_> {
    fn at_end(&self) -> bool {
        self.position >= self.tokens.len()
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.position)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.position).cloned();
        self.position += 1;
        token
    }

    fn error(&self, why: &str) -> ApiError {
        ApiError::BadRequest(format!(
            "unable to parse requirement: {why} in label selector {:?}",
            self.text
        ))
    }

    fn requirement(&mut self) -> Result<LabelRequirement, ApiError> {
        match self.next() {
            Some(Token::Not) => Ok(LabelRequirement::NotExists(self.key()?)),
            Some(Token::Word(key)) => {
                validate_key(&key).map_err(|why| self.error(&why))?;
                self.operator(key)
            }
            other => Err(self.error(&format!("expected a label key, found {other:?}"))),
        }
    }

    fn key(&mut self) -> Result<String, ApiError> {
        match self.next() {
            Some(Token::Word(key)) => {
                validate_key(&key).map_err(|why| self.error(&why))?;
                Ok(key)
            }
            other => Err(self.error(&format!("expected a label key, found {other:?}"))),
        }
    }

    fn operator(&mut self, key: String) -> Result<LabelRequirement, ApiError> {
        match self.peek().cloned() {
            None | Some(Token::Comma) => Ok(LabelRequirement::Exists(key)),
            Some(Token::Equals | Token::DoubleEquals) => {
                self.next();
                Ok(LabelRequirement::Equals(key, self.single_value()?))
            }
            Some(Token::NotEquals) => {
                self.next();
                Ok(LabelRequirement::NotEquals(key, self.single_value()?))
            }
            Some(Token::Word(word)) if word == "in" || word == "notin" => {
                self.next();
                let set = self.value_set()?;
                Ok(if word == "in" {
                    LabelRequirement::In(key, set)
                } else {
                    LabelRequirement::NotIn(key, set)
                })
            }
            Some(Token::Greater | Token::Less) => {
                let greater = self.next() == Some(Token::Greater);
                let bound = self.number()?;
                Ok(if greater {
                    LabelRequirement::GreaterThan(key, bound)
                } else {
                    LabelRequirement::LessThan(key, bound)
                })
            }
            Some(other) => Err(self.error(&format!("unexpected {other:?} after key {key:?}"))),
        }
    }

    /// A value after `=`/`!=`; an absent word means the empty value (`key=`).
    fn single_value(&mut self) -> Result<String, ApiError> {
        match self.peek().cloned() {
            None | Some(Token::Comma) => Ok(String::new()),
            Some(Token::Word(value)) => {
                self.next();
                validate_value(&value).map_err(|why| self.error(&why))?;
                Ok(value)
            }
            Some(other) => Err(self.error(&format!("expected a value, found {other:?}"))),
        }
    }

    fn value_set(&mut self) -> Result<Vec<String>, ApiError> {
        if self.next() != Some(Token::Open) {
            return Err(self.error("expected '(' to open a set of values"));
        }
        let mut values = Vec::new();
        loop {
            match self.next() {
                Some(Token::Word(value)) => {
                    validate_value(&value).map_err(|why| self.error(&why))?;
                    values.push(value);
                }
                Some(Token::Comma) => continue,
                Some(Token::Close) if !values.is_empty() => return Ok(values),
                Some(Token::Close) => return Err(self.error("a set of values must not be empty")),
                other => return Err(self.error(&format!("expected a value or ')', found {other:?}"))),
            }
        }
    }

    fn number(&mut self) -> Result<i64, ApiError> {
        match self.next() {
            Some(Token::Word(word)) => word
                .parse()
                .map_err(|_| self.error(&format!("{word:?} is not an integer"))),
            other => Err(self.error(&format!("expected an integer, found {other:?}"))),
        }
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name.
fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let valid_prefix = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !valid_prefix {
            return Err(format!(
                "key {key:?} has an invalid prefix (must be a DNS subdomain)"
            ));
        }
    }
    if name.is_empty() || !is_label_name(name) {
        return Err(format!("key {key:?} is not a valid label key"));
    }
    Ok(())
}

fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(format!("value {value:?} is not a valid label value"))
    }
}

/// At most 63 characters of `[A-Za-z0-9-_.]`, starting and ending alphanumeric.
fn is_label_name(text: &str) -> bool {
    let edges_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    text.len() <= 63
        && edges_ok(text.chars().next())
        && edges_ok(text.chars().last())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A parsed `fieldSelector` for one resource type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldTerm {
    path: &'static [&'static str],
    value: String,
    negated: bool,
}

impl FieldSelector {
    /// Parses a selector against the field labels `resource` supports; the empty string
    /// selects everything.
    pub fn parse(text: &str, resource: &ResourceType) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for term in split_unescaped(text, ',') {
            if term.trim().is_empty() {
                continue;
            }
            terms.push(parse_field_term(&term, resource)?);
        }
        Ok(FieldSelector { terms })
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.terms
            .iter()
            .all(|term| (field_value(object, term.path) == term.value) != term.negated)
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }
}

fn parse_field_term(term: &str, resource: &ResourceType) -> Result<FieldTerm, ApiError> {
    let (label, operator, raw_value) = split_field_operator(term).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "invalid selector: {term:?}; expected field=value or field!=value"
        ))
    })?;
    let label = label.trim();
    let path = resource.field_label_path(label).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "field label not supported: {label} (on {})",
            resource.qualified_name()
        ))
    })?;
    Ok(FieldTerm {
        path,
        value: unescape(raw_value.trim()),
        negated: operator == "!=",
    })
}

/// Splits `field<op>value` at the first unescaped `!=`, `==` or `=`.
fn split_field_operator(term: &str) -> Option<(&str, &'static str, &str)> {
    let bytes = term.as_bytes();
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'\\' => index += 2,
            b'!' if bytes.get(index + 1) == Some(&b'=') => {
                return Some((&term[..index], "!=", &term[index + 2..]));
            }
            b'=' if bytes.get(index + 1) == Some(&b'=') => {
                return Some((&term[..index], "==", &term[index + 2..]));
            }
            b'=' => return Some((&term[..index], "=", &term[index + 1..])),
            _ => index += 1,
        }
    }
    None
}

fn split_unescaped(text: &str, separator: char) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            parts.last_mut().into_iter().for_each(|p| p.push(c));
            if let Some(escaped) = chars.next() {
                parts.last_mut().into_iter().for_each(|p| p.push(escaped));
            }
        } else if c == separator {
            parts.push(String::new());
        } else {
            parts.last_mut().into_iter().for_each(|p| p.push(c));
        }
    }
    parts
}

fn unescape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(escaped) = chars.next() {
                out.push(escaped);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The field's value as the server's field sets render it: strings as-is, booleans and
/// numbers as text, anything missing as the empty string.
fn field_value(object: &Value, path: &[&str]) -> String {
    let mut current = object;
    for key in path {
        match current.get(key) {
            Some(next) => current = next,
            None => return String::new(),
        }
    }
    match current {
        Value::String(text) => text.clone(),
        Value::Bool(flag) => flag.to_string(),
        Value::Number(number) => number.to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{NODES, SERVICES};
    use serde_json::json;

    fn labelled(labels: Value) -> Value {
        json!({ "metadata": { "name": "web", "namespace": "prod", "labels": labels } })
    }

    fn selects(selector: &str, labels: Value) -> bool {
        LabelSelector::parse(selector).unwrap().matches(&labelled(labels))
    }

    #[test]
    fn equality_operators() {
        assert!(selects("app=web", json!({"app": "web"})));
        assert!(selects("app==web", json!({"app": "web"})));
        assert!(!selects("app=web", json!({"app": "db"})));
        assert!(!selects("app=web", json!({})));
        assert!(selects("app!=web", json!({"app": "db"})));
        assert!(
            selects("app!=web", json!({})),
            "!= matches objects without the label"
        );
        assert!(!selects("app!=web", json!({"app": "web"})));
    }

    #[test]
    fn set_operators() {
        assert!(selects("tier in (front, back)", json!({"tier": "back"})));
        assert!(!selects("tier in (front,back)", json!({"tier": "cache"})));
        assert!(!selects("tier in (front)", json!({})));
        assert!(selects("tier notin (front,back)", json!({"tier": "cache"})));
        assert!(
            selects("tier notin (front)", json!({})),
            "notin matches objects without the label"
        );
        assert!(!selects("tier notin (front,back)", json!({"tier": "front"})));
    }

    #[test]
    fn existence_operators() {
        assert!(selects("app", json!({"app": ""})));
        assert!(!selects("app", json!({})));
        assert!(selects("!service.kubernetes.io/headless", json!({"app": "x"})));
        assert!(!selects(
            "!service.kubernetes.io/headless",
            json!({"service.kubernetes.io/headless": ""})
        ));
    }

    #[test]
    fn comma_is_and_and_sets_keep_their_commas() {
        let selector = "app=web,tier in (front,back),!canary";
        assert!(selects(selector, json!({"app": "web", "tier": "front"})));
        assert!(!selects(
            selector,
            json!({"app": "web", "tier": "front", "canary": "1"})
        ));
        assert!(!selects(selector, json!({"app": "db", "tier": "front"})));
    }

    #[test]
    fn kube_proxy_selector_parses() {
        let selector = "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name";
        assert!(selects(selector, json!({"app": "x"})));
        assert!(!selects(
            selector,
            json!({"service.kubernetes.io/service-proxy-name": "other"})
        ));
    }

    #[test]
    fn numeric_comparisons() {
        assert!(selects("gen>3", json!({"gen": "4"})));
        assert!(!selects("gen>3", json!({"gen": "3"})));
        assert!(selects("gen<3", json!({"gen": "2"})));
        assert!(!selects("gen<3", json!({"gen": "x"})));
    }

    #[test]
    fn empty_selector_selects_everything() {
        assert!(LabelSelector::parse("").unwrap().is_empty());
        assert!(selects("", json!({})));
    }

    #[test]
    fn malformed_selectors_are_bad_requests() {
        for bad in [
            "app in web",
            "app in ()",
            "=web",
            "app=web=x",
            "app=(",
            "app>x",
            "-bad=1",
            "a%b=1",
            "x/=1",
        ] {
            let error = LabelSelector::parse(bad).unwrap_err();
            assert_eq!(error.code(), 400, "{bad}: {error}");
        }
    }

    #[test]
    fn field_selector_on_name_and_namespace() {
        let object = labelled(json!({}));
        let matches = |s: &str| FieldSelector::parse(s, &SERVICES).unwrap().matches(&object);
        assert!(matches("metadata.name=web"));
        assert!(matches("metadata.name==web,metadata.namespace=prod"));
        assert!(!matches("metadata.name!=web"));
        assert!(matches("metadata.namespace!=kube-system"));
        assert!(!matches("metadata.name=web,metadata.namespace=dev"));
    }

    #[test]
    fn field_selector_reads_typed_fields() {
        let node = json!({"metadata": {"name": "n1"}, "spec": {"unschedulable": true}});
        assert!(
            FieldSelector::parse("spec.unschedulable=true", &NODES)
                .unwrap()
                .matches(&node)
        );
        assert!(
            FieldSelector::parse("spec.unschedulable!=false", &NODES)
                .unwrap()
                .matches(&node)
        );
        let service = json!({"metadata": {"name": "s"}, "spec": {"clusterIP": "None"}});
        assert!(
            FieldSelector::parse("spec.clusterIP=None", &SERVICES)
                .unwrap()
                .matches(&service)
        );
        assert!(
            FieldSelector::parse("spec.type=", &SERVICES)
                .unwrap()
                .matches(&service)
        );
    }

    #[test]
    fn field_selector_escapes() {
        let object = json!({"metadata": {"name": "a,b=c"}});
        assert!(
            FieldSelector::parse(r"metadata.name=a\,b\=c", &SERVICES)
                .unwrap()
                .matches(&object)
        );
    }

    #[test]
    fn unsupported_field_labels_are_bad_requests() {
        let error = FieldSelector::parse("spec.clusterIP=1.2.3.4", &NODES).unwrap_err();
        assert_eq!(error.code(), 400);
        assert!(error.to_string().contains("spec.clusterIP"), "{error}");
        assert_eq!(
            FieldSelector::parse("metadata.name", &NODES).unwrap_err().code(),
            400
        );
    }
}
