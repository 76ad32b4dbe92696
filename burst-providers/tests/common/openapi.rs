//! OpenAPI checks for the providers' loopback fakes: every request an
//! adapter sends (its query parameters and its body) and every answer a fake
//! gives is checked against the provider's saved spec, so a drift between
//! the adapter, the fake and the spec fails a test.
//!
//! Operations are named `method, path` (`"post", "/v2/pods"`; the method in
//! any case), as the HTTP request line names them. This module finds an
//! operation's request, answer and query schemas; the `jsonschema` crate
//! validates values against them (JSON Schema 2020-12, which OpenAPI 3.1
//! schemas are). OpenAPI 3.0 schemas (Lambda's spec) are converted first:
//! `nullable: true` admits `null`, and boolean `exclusiveMinimum`/
//! `exclusiveMaximum` become the numeric form. `format` is an annotation
//! only, as JSON Schema 2020-12 has it by default.

use std::collections::BTreeMap;

use serde_json::Value;

/// Deepest `$ref` chain followed when finding an operation's parts: the
/// specs chain two or three at most, so more means a reference loop.
const MAX_DEPTH: usize = 64;

/// A loaded OpenAPI document.
#[derive(Debug, Clone)]
pub struct Spec {
    doc: Value,
    /// The document's `components` as JSON Schema 2020-12 (converted from
    /// OpenAPI 3.0 where the spec is 3.0), which every validated schema
    /// carries so that its `#/components/...` references resolve.
    components: Value,
    /// OpenAPI 3.0 (`nullable`, boolean exclusive bounds).
    v3_0: bool,
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
        let version = doc
            .get("openapi")
            .and_then(Value::as_str)
            .ok_or("not an OpenAPI 3 document (no `openapi` version)")?;
        let v3_0 = version.starts_with("3.0");
        let mut components = doc.get("components").cloned().unwrap_or(Value::Null);
        if v3_0 {
            from_openapi_3_0(&mut components);
        }
        Ok(Spec {
            doc,
            components,
            v3_0,
        })
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
    /// `json-pointer: what` (`/gpu/count: 0 is less than the minimum of 1`).
    /// `schema` may `$ref` anything under `#/components`.
    pub fn validate(&self, schema: &Value, value: &Value) -> Vec<String> {
        let mut root = schema.clone();
        if self.v3_0 {
            from_openapi_3_0(&mut root);
        }
        let root = match root {
            Value::Object(mut map) => {
                map.insert("components".into(), self.components.clone());
                Value::Object(map)
            }
            // `true` and `false` reference nothing.
            other => other,
        };
        let validator = match jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&root)
        {
            Ok(v) => v,
            Err(e) => return vec![format!("the schema itself is invalid: {e}")],
        };
        validator
            .iter_errors(value)
            .map(|e| {
                let at = e.instance_path().to_string();
                format!("{}: {e}", if at.is_empty() { "/" } else { &at })
            })
            .collect()
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

/// Rewrites OpenAPI 3.0 schema keywords, everywhere in `v`, as JSON Schema
/// 2020-12 says them: `nullable: true` admits `null` (a `null` type beside
/// a single `type` and no `enum`, else `anyOf` with `{"type": "null"}`), and
/// `exclusiveMinimum: true` beside `minimum` becomes `exclusiveMinimum:
/// <minimum>` (the same for the maximum). Values that are data, not schemas
/// (`example`, `examples`, `enum`, `const`, `default`), are left alone.
fn from_openapi_3_0(v: &mut Value) {
    match v {
        Value::Array(items) => items.iter_mut().for_each(from_openapi_3_0),
        Value::Object(map) => {
            for (key, sub) in map.iter_mut() {
                if !matches!(
                    key.as_str(),
                    "example" | "examples" | "enum" | "const" | "default"
                ) {
                    from_openapi_3_0(sub);
                }
            }
            for (flag, bound) in [
                ("exclusiveMinimum", "minimum"),
                ("exclusiveMaximum", "maximum"),
            ] {
                match map.get(flag) {
                    Some(Value::Bool(true)) => {
                        if let Some(b) = map.remove(bound) {
                            map.insert(flag.into(), b);
                        } else {
                            map.remove(flag);
                        }
                    }
                    Some(Value::Bool(false)) => {
                        map.remove(flag);
                    }
                    _ => {}
                }
            }
            if map.get("nullable") == Some(&Value::Bool(true)) {
                map.remove("nullable");
                match map.get("type") {
                    Some(Value::String(t)) if !map.contains_key("enum") => {
                        let t = Value::String(t.clone());
                        map.insert("type".into(), Value::Array(vec![t, "null".into()]));
                    }
                    _ => {
                        let rest = Value::Object(std::mem::take(map));
                        map.insert(
                            "anyOf".into(),
                            serde_json::json!([{ "type": "null" }, rest]),
                        );
                    }
                }
            } else if map.get("nullable") == Some(&Value::Bool(false)) {
                map.remove("nullable");
            }
        }
        _ => {}
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
