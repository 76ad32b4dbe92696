//! A small OpenAPI schema validator for the providers' loopback fakes: every
//! request an adapter sends (its query parameters and its body) and every
//! answer a fake gives is checked against the provider's saved spec, so a
//! drift between the adapter, the fake and the spec fails a test.
//!
//! Operations are named `method, path` (`"post", "/v2/pods"`; the method in
//! any case), as the HTTP request line names them.
//!
//! Checked: `$ref` (to anywhere in the document, `#/...`, together with the
//! keywords beside it), `type` (one name, or an OpenAPI 3.1 list like
//! `["string", "null"]`), OpenAPI 3.0 `nullable`, `enum`, `const` (numbers
//! compared by value: `1` equals `1.0`), `required`, `properties`,
//! `additionalProperties` (`false` or a schema), `unevaluatedProperties`
//! (`false` or a schema, over the properties not named by the schema or by
//! any subschema that held), `items`, `minItems`/`maxItems`,
//! `minLength`/`maxLength`, `minimum`/`maximum` and their exclusive forms,
//! `allOf`, `anyOf` and `oneOf` (valid against at least one choice: generated
//! specs often have overlapping `oneOf` branches), `not` and
//! `if`/`then`/`else`. Not checked: `pattern`, `format` and the rarer
//! keywords (`uniqueItems`, `minProperties`, `dependentRequired`, …); a fake
//! checks the ones it cares about by hand.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// Deepest `$ref` chain or subschema nesting followed: the specs nest a
/// dozen levels at most, so more means a reference loop.
const MAX_DEPTH: usize = 64;

/// A loaded OpenAPI document.
#[derive(Debug, Clone)]
pub struct Spec {
    doc: Value,
}

impl Spec {
    /// The spec file at `path` (JSON or YAML); panics when it cannot be read
    /// or is not an OpenAPI document.
    pub fn load(path: &str) -> Spec {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        Spec::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// A spec from its text: JSON if it parses as JSON, else YAML.
    pub fn parse(text: &str) -> Result<Spec, String> {
        let doc = match serde_json::from_str::<Value>(text) {
            Ok(v) => v,
            Err(json) => serde_saphyr::from_str::<Value>(text)
                .map_err(|yaml| format!("neither JSON ({json}) nor YAML ({yaml})"))?,
        };
        if doc.get("openapi").is_none() && doc.get("swagger").is_none() {
            return Err("not an OpenAPI document".into());
        }
        Ok(Spec { doc })
    }

    /// The whole document.
    pub fn doc(&self) -> &Value {
        &self.doc
    }

    /// `v` with its `$ref`s (at the top, repeatedly) followed.
    pub fn resolve<'a>(&'a self, mut v: &'a Value) -> Result<&'a Value, String> {
        for _ in 0..MAX_DEPTH {
            match v.get("$ref").and_then(Value::as_str) {
                Some(r) => v = self.target(r)?,
                None => return Ok(v),
            }
        }
        Err(format!("references nest deeper than {MAX_DEPTH}"))
    }

    /// The value a `#/a/b/c` reference names.
    fn target(&self, reference: &str) -> Result<&Value, String> {
        let pointer = reference
            .strip_prefix('#')
            .ok_or_else(|| format!("{reference}: only references within the spec are supported"))?;
        self.doc
            .pointer(pointer)
            .ok_or_else(|| format!("{reference}: no such place in the spec"))
    }

    /// The schema at `#/components/schemas/{name}`; panics when there is none.
    pub fn schema(&self, name: &str) -> &Value {
        self.doc
            .pointer(&format!("/components/schemas/{name}"))
            .unwrap_or_else(|| panic!("the spec has no schema {name}"))
    }

    /// The path item of `path` (a template, `/v2/pods/{id}`), its `$ref`
    /// followed.
    fn path_item(&self, path: &str) -> Result<&Value, String> {
        let item = self
            .doc
            .get("paths")
            .and_then(|p| p.get(path))
            .ok_or_else(|| format!("the spec has no path {path}"))?;
        self.resolve(item)
    }

    /// The operation `method path`.
    pub fn operation(&self, method: &str, path: &str) -> Result<&Value, String> {
        self.path_item(path)?
            .get(method.to_ascii_lowercase())
            .ok_or_else(|| format!("the spec has no {} {path}", upper(method)))
    }

    /// The JSON schema of `method path`'s request body (`application/json`,
    /// else another JSON media type).
    pub fn request_schema(&self, method: &str, path: &str) -> Result<&Value, String> {
        let m = upper(method);
        let body = self
            .operation(method, path)?
            .get("requestBody")
            .ok_or_else(|| format!("{m} {path} takes no request body"))?;
        let content = self
            .resolve(body)?
            .get("content")
            .ok_or_else(|| format!("{m} {path}: the request body has no content"))?;
        content
            .get("application/json")
            .or_else(|| {
                content
                    .as_object()?
                    .iter()
                    .find(|(k, _)| k.contains("json"))
                    .map(|(_, v)| v)
            })
            .and_then(|c| c.get("schema"))
            .ok_or_else(|| format!("{m} {path}: no JSON request body schema"))
    }

    /// `method path`'s documented answer for `status`: the exact code, else
    /// its range (`4XX`), else `default`; its `$ref` followed.
    pub fn response(&self, method: &str, path: &str, status: u16) -> Result<&Value, String> {
        let m = upper(method);
        let responses = self
            .operation(method, path)?
            .get("responses")
            .ok_or_else(|| format!("{m} {path} has no responses"))?;
        let r = responses
            .get(status.to_string())
            .or_else(|| responses.get(format!("{}XX", status / 100)))
            .or_else(|| responses.get("default"))
            .ok_or_else(|| format!("{m} {path}: the spec documents no {status} answer"))?;
        self.resolve(r)
    }

    /// The schema of `method path`'s `status` answer in `content_type` (its
    /// parameters, `; charset=…`, ignored); `None` when the answer has no
    /// body (a 204).
    pub fn response_schema(
        &self,
        method: &str,
        path: &str,
        status: u16,
        content_type: &str,
    ) -> Result<Option<&Value>, String> {
        let r = self.response(method, path, status)?;
        let Some(content) = r.get("content") else {
            return Ok(None);
        };
        let media = media_type(content_type);
        content
            .get(media)
            .and_then(|c| c.get("schema"))
            .map(Some)
            .ok_or_else(|| {
                format!(
                    "{} {path}: the spec's {status} answer is not {media}",
                    upper(method)
                )
            })
    }

    /// Every way `value` breaks `schema` (empty: valid), each as
    /// `json-path: what`.
    pub fn validate(&self, schema: &Value, value: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        self.check(schema, value, "$", 0, &mut errors);
        errors
    }

    /// Every way `body` breaks the schema of `method path`'s request body.
    pub fn validate_request(&self, method: &str, path: &str, body: &Value) -> Vec<String> {
        let m = upper(method);
        match self.request_schema(method, path) {
            Ok(schema) => self
                .validate(schema, body)
                .into_iter()
                .map(|e| format!("{m} {path} request: {e}"))
                .collect(),
            Err(e) => vec![e],
        }
    }

    /// Every way an answer's `body` (its text, empty for none) breaks what
    /// the spec says `method path` answers with `status` in `content_type`.
    pub fn validate_response(
        &self,
        method: &str,
        path: &str,
        status: u16,
        content_type: &str,
        body: &str,
    ) -> Vec<String> {
        let m = upper(method);
        match self.response_schema(method, path, status, content_type) {
            Err(e) => vec![e],
            Ok(None) if body.is_empty() => Vec::new(),
            Ok(None) => vec![format!(
                "{m} {path} {status}: the spec says no body, the answer has one"
            )],
            Ok(Some(schema)) => match serde_json::from_str::<Value>(body) {
                Ok(v) => self
                    .validate(schema, &v)
                    .into_iter()
                    .map(|e| format!("{m} {path} {status}: {e}"))
                    .collect(),
                Err(e) => vec![format!("{m} {path} {status}: not JSON: {e}")],
            },
        }
    }

    /// Every way a request's query parameters break `method path`'s
    /// `parameters` (the operation's, and its path's it does not redefine):
    /// unknown names, missing required ones, and each value against its
    /// schema (`style: form, explode: false` arrays are comma-separated).
    pub fn validate_query(
        &self,
        method: &str,
        path: &str,
        query: &BTreeMap<String, String>,
    ) -> Vec<String> {
        let m = upper(method);
        let (item, op) = match (self.path_item(path), self.operation(method, path)) {
            (Ok(item), Ok(op)) => (item, op),
            (Err(e), _) | (_, Err(e)) => return vec![e],
        };
        let mut errors = Vec::new();
        let mut params: Vec<&Value> = Vec::new();
        for source in [op, item] {
            for p in source
                .get("parameters")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let p = match self.resolve(p) {
                    Ok(p) => p,
                    Err(e) => {
                        errors.push(format!("{m} {path}: parameter: {e}"));
                        continue;
                    }
                };
                let name = p.get("name");
                if p.get("in").and_then(Value::as_str) == Some("query")
                    && !params.iter().any(|q| q.get("name") == name)
                {
                    params.push(p);
                }
            }
        }
        for (name, raw) in query {
            let Some(param) = params
                .iter()
                .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
            else {
                errors.push(format!("{m} {path}: unknown query parameter {name}"));
                continue;
            };
            let schema = param.get("schema").unwrap_or(&Value::Bool(true));
            let value = match self.resolve(schema) {
                Ok(s) => query_value(s, raw),
                Err(_) => Value::String(raw.clone()),
            };
            for e in self.validate(schema, &value) {
                errors.push(format!("{m} {path}: query {name}: {e}"));
            }
        }
        for p in &params {
            let name = p.get("name").and_then(Value::as_str).unwrap_or("");
            if p.get("required").and_then(Value::as_bool) == Some(true) && !query.contains_key(name)
            {
                errors.push(format!("{m} {path}: query parameter {name} is required"));
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
            errors.push(format!("{at}: schemas nest deeper than {MAX_DEPTH}"));
            return evaluated;
        }
        // `true`/`{}` accept anything; `false` nothing.
        match schema {
            Value::Bool(true) => return evaluated,
            Value::Bool(false) => {
                errors.push(format!("{at}: no value is allowed here"));
                return evaluated;
            }
            Value::Object(_) => {}
            _ => {
                errors.push(format!("{at}: the schema is not an object"));
                return evaluated;
            }
        }
        if v.is_null() && schema.get("nullable").and_then(Value::as_bool) == Some(true) {
            return evaluated;
        }
        if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            match self.target(r) {
                Ok(target) => evaluated.extend(self.check(target, v, at, depth + 1, errors)),
                Err(e) => errors.push(format!("{at}: {e}")),
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
                    "{at}: {} is not of type {}",
                    short(v),
                    names.join(" or ")
                ));
                return evaluated;
            }
        }
        if let Some(options) = schema.get("enum").and_then(Value::as_array)
            && !options.iter().any(|o| json_eq(o, v))
        {
            errors.push(format!(
                "{at}: {} is not one of {}",
                short(v),
                Value::Array(options.clone())
            ));
        }
        if let Some(c) = schema.get("const")
            && !json_eq(c, v)
        {
            errors.push(format!("{at}: {} is not {c}", short(v)));
        }

        if let Some(subs) = schema.get("allOf").and_then(Value::as_array) {
            for s in subs {
                evaluated.extend(self.check(s, v, at, depth + 1, errors));
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(subs) = schema.get(key).and_then(Value::as_array) {
                let mut fits = false;
                let mut why = Vec::new();
                for s in subs {
                    let mut e = Vec::new();
                    let ev = self.check(s, v, at, depth + 1, &mut e);
                    if e.is_empty() {
                        fits = true;
                        evaluated.extend(ev);
                    } else {
                        why.push(e.join(", "));
                    }
                }
                if !fits {
                    errors.push(format!("{at}: fits none of {key}: [{}]", why.join(" | ")));
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
                            errors.push(format!("{at}: {name} is required"));
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
                let named = |name: &String| props.is_some_and(|p| p.contains_key(name));
                match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        for name in map.keys().filter(|n| !named(n)) {
                            errors.push(format!("{at}.{name}: not a property the schema allows"));
                        }
                        evaluated.extend(map.keys().cloned());
                    }
                    Some(sub @ Value::Object(_)) => {
                        for (name, value) in map.iter().filter(|(n, _)| !named(n)) {
                            self.check(sub, value, &format!("{at}.{name}"), depth + 1, errors);
                        }
                        evaluated.extend(map.keys().cloned());
                    }
                    _ => {}
                }
                match schema.get("unevaluatedProperties") {
                    Some(Value::Bool(false)) => {
                        for name in map.keys().filter(|n| !evaluated.contains(*n)) {
                            errors.push(format!(
                                "{at}.{name}: not a property the schema or its subschemas allow"
                            ));
                        }
                        evaluated.extend(map.keys().cloned());
                    }
                    Some(sub @ Value::Object(_)) => {
                        for (name, value) in map.iter().filter(|(n, _)| !evaluated.contains(*n)) {
                            self.check(sub, value, &format!("{at}.{name}"), depth + 1, errors);
                        }
                        evaluated.extend(map.keys().cloned());
                    }
                    _ => {}
                }
            }
            Value::Array(items) => {
                let n = items.len() as u64;
                if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                    && n < min
                {
                    errors.push(format!("{at}: {n} items, fewer than {min}"));
                }
                if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                    && n > max
                {
                    errors.push(format!("{at}: {n} items, more than {max}"));
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
            Value::Null | Value::Bool(_) => {}
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

/// Whether `v` is of JSON-schema type `name` (an unknown name: no value is).
fn is_type(v: &Value, name: &str) -> bool {
    match name {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|x| x.fract() == 0.0),
        _ => false,
    }
}

/// JSON equality with numbers compared by value (`1` equals `1.0`).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// A media type without its parameters (`application/json; charset=utf-8`).
fn media_type(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or("").trim()
}

/// The method as an HTTP request line spells it, for messages.
fn upper(method: &str) -> String {
    method.to_ascii_uppercase()
}

/// A value for a message, cut at 80 characters.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 80 {
        format!("{}…", s.chars().take(80).collect::<String>())
    } else {
        s
    }
}
