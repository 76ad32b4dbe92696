//! A small OpenAPI schema validator for the provider fakes: every request
//! body an adapter sends and every response body a fake returns is checked
//! against the provider's saved spec, so a drift between the adapter, the
//! fake and the spec fails a test.
//!
//! It checks `$ref` (to `#/components/...`), `type` (a name or an OpenAPI
//! 3.1 array of names, and 3.0 `nullable`), `enum`, `const`, `required`,
//! `properties`, `additionalProperties` (`false` or a schema),
//! `unevaluatedProperties: false` (properties named by the schema or by any
//! subschema that held), `items`, `minItems`/`maxItems`,
//! `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`,
//! `minLength`/`maxLength`, `allOf`, `anyOf`/`oneOf` (valid against at least
//! one), `not` and `if`/`then`/`else`. It does not check `pattern` or
//! `format`.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// Deepest `$ref` chain or subschema nesting followed: the specs nest a
/// dozen levels at most, so more means a reference loop.
const MAX_DEPTH: usize = 64;

/// A loaded OpenAPI document.
pub struct Spec {
    pub doc: Value,
}

impl Spec {
    /// Loads a JSON or YAML spec file.
    pub fn load(path: &str) -> Spec {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let doc: Value = if path.ends_with(".json") {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
        } else {
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        Spec { doc }
    }

    /// The value at a `#/a/b/c` reference.
    pub fn resolve(&self, reference: &str) -> Option<&Value> {
        let pointer = reference.strip_prefix('#')?;
        self.doc.pointer(pointer)
    }

    /// A value with its `$ref`s (at the top, repeatedly) followed.
    fn deref<'a>(&'a self, mut v: &'a Value) -> &'a Value {
        for _ in 0..MAX_DEPTH {
            match v.get("$ref").and_then(Value::as_str) {
                Some(r) => match self.resolve(r) {
                    Some(target) => v = target,
                    None => return v,
                },
                None => return v,
            }
        }
        v
    }

    /// The schema named `#/components/schemas/{name}`.
    pub fn schema(&self, name: &str) -> &Value {
        self.doc
            .pointer(&format!("/components/schemas/{name}"))
            .unwrap_or_else(|| panic!("the spec has no schema {name}"))
    }

    /// The operation `method` on `path` (`/v2/pods`, `post`).
    pub fn operation(&self, path: &str, method: &str) -> &Value {
        self.doc
            .get("paths")
            .and_then(|p| p.get(path))
            .and_then(|p| p.get(method))
            .unwrap_or_else(|| panic!("the spec has no {method} {path}"))
    }

    /// The JSON request-body schema of an operation.
    pub fn request_schema(&self, path: &str, method: &str) -> &Value {
        let op = self.operation(path, method);
        let body = self.deref(
            op.get("requestBody")
                .unwrap_or_else(|| panic!("{method} {path} takes no body")),
        );
        body.pointer("/content/application~1json/schema")
            .unwrap_or_else(|| panic!("{method} {path} has no JSON body schema"))
    }

    /// The response of an operation for `status` (or its `default`), with
    /// its `$ref` followed; `None` when the spec documents neither.
    pub fn response(&self, path: &str, method: &str, status: u16) -> Option<&Value> {
        let responses = self.operation(path, method).get("responses")?;
        let r = responses
            .get(status.to_string())
            .or_else(|| responses.get("default"))?;
        Some(self.deref(r))
    }

    /// The schema of an operation's `status` answer in `content_type`;
    /// `None` when the answer has no body (a 204).
    pub fn response_schema(
        &self,
        path: &str,
        method: &str,
        status: u16,
        content_type: &str,
    ) -> Result<Option<&Value>, String> {
        let r = self
            .response(path, method, status)
            .ok_or_else(|| format!("{method} {path}: the spec documents no {status} answer"))?;
        let Some(content) = r.get("content") else {
            return Ok(None);
        };
        content
            .get(content_type)
            .and_then(|c| c.get("schema"))
            .map(Some)
            .ok_or_else(|| {
                format!("{method} {path}: the spec's {status} answer is not {content_type}")
            })
    }

    /// Checks `instance` against `schema`; each violation as `path: what`.
    pub fn validate(&self, schema: &Value, instance: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        self.check(schema, instance, "$", 0, &mut errors);
        errors
    }

    /// Checks an answer's body against what the spec says `method path`
    /// answers with `status`.
    pub fn validate_response(
        &self,
        path: &str,
        method: &str,
        status: u16,
        content_type: &str,
        body: &str,
    ) -> Vec<String> {
        match self.response_schema(path, method, status, content_type) {
            Err(e) => vec![e],
            Ok(None) if body.is_empty() => Vec::new(),
            Ok(None) => vec![format!(
                "{method} {path} {status}: the spec says no body, the answer has one"
            )],
            Ok(Some(schema)) => match serde_json::from_str::<Value>(body) {
                Ok(v) => self
                    .validate(schema, &v)
                    .into_iter()
                    .map(|e| format!("{method} {path} {status}: {e}"))
                    .collect(),
                Err(e) => vec![format!("{method} {path} {status}: not JSON: {e}")],
            },
        }
    }

    /// Checks a request's query parameters against the operation's
    /// `parameters` (unknown names, required ones, and each value against its
    /// schema; `style: form, explode: false` arrays are comma-separated).
    pub fn validate_query(
        &self,
        path: &str,
        method: &str,
        query: &BTreeMap<String, String>,
    ) -> Vec<String> {
        let mut errors = Vec::new();
        let path_item = self.doc.get("paths").and_then(|p| p.get(path));
        let mut params = Vec::new();
        for source in [
            path_item.and_then(|p| p.get("parameters")),
            Some(self.operation(path, method)).and_then(|o| o.get("parameters")),
        ]
        .into_iter()
        .flatten()
        {
            for p in source.as_array().into_iter().flatten() {
                let p = self.deref(p);
                if p.get("in").and_then(Value::as_str) == Some("query") {
                    params.push(p);
                }
            }
        }
        for (name, raw) in query {
            let Some(param) = params
                .iter()
                .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
            else {
                errors.push(format!("{method} {path}: unknown query parameter {name}"));
                continue;
            };
            let schema = self.deref(param.get("schema").unwrap_or(&Value::Null));
            let value = query_value(schema, raw);
            for e in self.validate(schema, &value) {
                errors.push(format!("{method} {path}: query {name}: {e}"));
            }
        }
        for p in &params {
            let name = p.get("name").and_then(Value::as_str).unwrap_or("");
            if p.get("required").and_then(Value::as_bool) == Some(true) && !query.contains_key(name)
            {
                errors.push(format!(
                    "{method} {path}: query parameter {name} is required"
                ));
            }
        }
        errors
    }

    /// Checks `v` against `schema`, pushing violations; returns the names of
    /// the object properties this schema evaluated (for
    /// `unevaluatedProperties`).
    fn check(
        &self,
        schema: &Value,
        v: &Value,
        at: &str,
        depth: usize,
        errors: &mut Vec<String>,
    ) -> BTreeSet<String> {
        let mut evaluated = BTreeSet::new();
        if depth > MAX_DEPTH {
            errors.push(format!("{at}: schema nesting deeper than {MAX_DEPTH}"));
            return evaluated;
        }
        let schema = match schema {
            Value::Bool(true) => return evaluated,
            Value::Bool(false) => {
                errors.push(format!("{at}: no value is allowed here"));
                return evaluated;
            }
            Value::Object(_) => schema,
            _ => return evaluated,
        };
        if v.is_null() && schema.get("nullable").and_then(Value::as_bool) == Some(true) {
            return evaluated;
        }
        if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            match self.resolve(r) {
                Some(target) => {
                    evaluated.extend(self.check(target, v, at, depth + 1, errors));
                }
                None => errors.push(format!("{at}: unresolvable $ref {r}")),
            }
        }
        if let Some(t) = schema.get("type") {
            let names: Vec<&str> = match t {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if !names.is_empty() && !names.iter().any(|n| is_type(v, n)) {
                errors.push(format!(
                    "{at}: expected {}, found {}",
                    names.join(" or "),
                    type_name(v)
                ));
                return evaluated;
            }
        }
        if let Some(options) = schema.get("enum").and_then(Value::as_array)
            && !options.iter().any(|o| json_eq(o, v))
        {
            errors.push(format!(
                "{at}: {v} is not one of {}",
                Value::Array(options.clone())
            ));
        }
        if let Some(c) = schema.get("const")
            && !json_eq(c, v)
        {
            errors.push(format!("{at}: {v} is not {c}"));
        }

        if let Some(subs) = schema.get("allOf").and_then(Value::as_array) {
            for s in subs {
                evaluated.extend(self.check(s, v, at, depth + 1, errors));
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(subs) = schema.get(key).and_then(Value::as_array) {
                let mut any = false;
                let mut why = Vec::new();
                for s in subs {
                    let mut e = Vec::new();
                    let ev = self.check(s, v, at, depth + 1, &mut e);
                    if e.is_empty() {
                        any = true;
                        evaluated.extend(ev);
                    } else {
                        why.push(e.join(", "));
                    }
                }
                if !any {
                    errors.push(format!(
                        "{at}: matches none of {key}: [{}]",
                        why.join(" | ")
                    ));
                }
            }
        }
        if let Some(not) = schema.get("not") {
            let mut e = Vec::new();
            self.check(not, v, at, depth + 1, &mut e);
            if e.is_empty() {
                errors.push(format!("{at}: matches a schema it must not ({not})"));
            }
        }
        if let Some(cond) = schema.get("if") {
            let mut e = Vec::new();
            let ev = self.check(cond, v, at, depth + 1, &mut e);
            if e.is_empty() {
                evaluated.extend(ev);
                if let Some(then) = schema.get("then") {
                    evaluated.extend(self.check(then, v, at, depth + 1, errors));
                }
            } else if let Some(otherwise) = schema.get("else") {
                evaluated.extend(self.check(otherwise, v, at, depth + 1, errors));
            }
        }

        match v {
            Value::Object(map) => {
                if let Some(req) = schema.get("required").and_then(Value::as_array) {
                    for name in req.iter().filter_map(Value::as_str) {
                        if !map.contains_key(name) {
                            errors.push(format!("{at}: missing required property {name}"));
                        }
                    }
                }
                let props = schema.get("properties").and_then(Value::as_object);
                if let Some(props) = props {
                    for (name, sub) in props {
                        if let Some(value) = map.get(name) {
                            self.check(sub, value, &format!("{at}.{name}"), depth + 1, errors);
                            evaluated.insert(name.clone());
                        }
                    }
                }
                match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        for name in map.keys() {
                            if !props.is_some_and(|p| p.contains_key(name)) {
                                errors
                                    .push(format!("{at}: additional property {name} not allowed"));
                            }
                        }
                        evaluated.extend(map.keys().cloned());
                    }
                    Some(sub @ Value::Object(_)) => {
                        for (name, value) in map {
                            if !props.is_some_and(|p| p.contains_key(name)) {
                                self.check(sub, value, &format!("{at}.{name}"), depth + 1, errors);
                            }
                        }
                        evaluated.extend(map.keys().cloned());
                    }
                    _ => {}
                }
                match schema.get("unevaluatedProperties") {
                    Some(Value::Bool(false)) => {
                        for name in map.keys() {
                            if !evaluated.contains(name) {
                                errors
                                    .push(format!("{at}: unevaluated property {name} not allowed"));
                            }
                        }
                        evaluated.extend(map.keys().cloned());
                    }
                    Some(sub @ Value::Object(_)) => {
                        for (name, value) in map {
                            if !evaluated.contains(name) {
                                self.check(sub, value, &format!("{at}.{name}"), depth + 1, errors);
                            }
                        }
                        evaluated.extend(map.keys().cloned());
                    }
                    _ => {}
                }
            }
            Value::Array(items) => {
                if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                    && (items.len() as u64) < min
                {
                    errors.push(format!("{at}: {} items, fewer than {min}", items.len()));
                }
                if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                    && (items.len() as u64) > max
                {
                    errors.push(format!("{at}: {} items, more than {max}", items.len()));
                }
                if let Some(sub) = schema.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        self.check(sub, item, &format!("{at}[{i}]"), depth + 1, errors);
                    }
                }
            }
            Value::Number(n) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                let bound = |k: &str| schema.get(k).and_then(Value::as_f64);
                if let Some(min) = bound("minimum")
                    && x < min
                {
                    errors.push(format!("{at}: {n} is below the minimum {min}"));
                }
                if let Some(max) = bound("maximum")
                    && x > max
                {
                    errors.push(format!("{at}: {n} is above the maximum {max}"));
                }
                if let Some(min) = bound("exclusiveMinimum")
                    && x <= min
                {
                    errors.push(format!("{at}: {n} is not above {min}"));
                }
                if let Some(max) = bound("exclusiveMaximum")
                    && x >= max
                {
                    errors.push(format!("{at}: {n} is not below {max}"));
                }
            }
            Value::String(s) => {
                let len = s.chars().count() as u64;
                if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                    && len < min
                {
                    errors.push(format!("{at}: {len} characters, fewer than {min}"));
                }
                if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                    && len > max
                {
                    errors.push(format!("{at}: {len} characters, more than {max}"));
                }
            }
            _ => {}
        }
        evaluated
    }
}

/// A query parameter's text as the JSON value its schema describes.
fn query_value(schema: &Value, raw: &str) -> Value {
    let type_name = schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("string");
    let scalar = |s: &str, t: &str| -> Value {
        match t {
            "integer" => s
                .parse::<i64>()
                .map(Value::from)
                .unwrap_or_else(|_| Value::String(s.to_string())),
            "number" => s
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number)
                .unwrap_or_else(|| Value::String(s.to_string())),
            "boolean" => match s {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => Value::String(s.to_string()),
            },
            _ => Value::String(s.to_string()),
        }
    };
    if type_name == "array" {
        let item_type = schema
            .get("items")
            .and_then(|i| i.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("string");
        Value::Array(raw.split(',').map(|s| scalar(s, item_type)).collect())
    } else {
        scalar(raw, type_name)
    }
}

fn is_type(v: &Value, name: &str) -> bool {
    match name {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|x| x.fract() == 0.0),
        _ => true,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// JSON equality with numbers compared by value (`1` equals `1.0`).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}
