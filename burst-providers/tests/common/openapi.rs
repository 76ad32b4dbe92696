//! A small OpenAPI schema validator for the providers' loopback fakes: the
//! fakes check every request body an adapter sends, and every answer they
//! give, against the provider's saved spec, so an adapter drifting from the
//! spec (or a fake drifting from it) fails its tests.
//!
//! Checked: `$ref` (to anywhere in the document, `#/...`), `type` (one, or an
//! OpenAPI 3.1 list like `["string", "null"]`), `nullable`, `enum`, `const`,
//! `required`, `properties`, `additionalProperties` (`false` or a schema),
//! `items`, `minItems`/`maxItems`, `minLength`/`maxLength`,
//! `minimum`/`maximum` (and their exclusive forms), `allOf`, `anyOf` and
//! `oneOf` (a value valid against at least one of the choices: generated
//! specs often have overlapping `oneOf` branches). Not checked: `pattern`
//! and `format` (a fake checks the patterns it cares about by hand).

#![allow(dead_code)]

use serde_json::Value;

/// A loaded OpenAPI document (YAML or JSON).
#[derive(Debug, Clone)]
pub struct Spec {
    doc: Value,
}

/// How deep `$ref`s and nested schemas may go before the validator gives up
/// (a spec with a reference cycle).
const MAX_DEPTH: usize = 64;

impl Spec {
    /// The spec at `path`: JSON if it parses as JSON, else YAML.
    pub fn load(path: &str) -> Spec {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        Spec::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    pub fn parse(text: &str) -> Result<Spec, String> {
        let doc = match serde_json::from_str::<Value>(text) {
            Ok(v) => v,
            Err(_) => serde_saphyr::from_str::<Value>(text).map_err(|e| e.to_string())?,
        };
        if doc.get("openapi").is_none() && doc.get("swagger").is_none() {
            return Err("not an OpenAPI document".into());
        }
        Ok(Spec { doc })
    }

    pub fn doc(&self) -> &Value {
        &self.doc
    }

    /// `v` with `$ref`s followed until it is not a reference.
    pub fn resolve<'a>(&'a self, mut v: &'a Value) -> Result<&'a Value, String> {
        for _ in 0..MAX_DEPTH {
            match v.get("$ref").and_then(Value::as_str) {
                Some(r) => {
                    let pointer = r
                        .strip_prefix('#')
                        .ok_or_else(|| format!("{r}: only local references are supported"))?;
                    v = self
                        .doc
                        .pointer(pointer)
                        .ok_or_else(|| format!("{r}: no such place in the spec"))?;
                }
                None => return Ok(v),
            }
        }
        Err("references nest too deep".into())
    }

    fn operation(&self, method: &str, path: &str) -> Result<&Value, String> {
        let item = self
            .doc
            .get("paths")
            .and_then(|p| p.get(path))
            .ok_or_else(|| format!("the spec has no path {path}"))?;
        let item = self.resolve(item)?;
        item.get(method.to_ascii_lowercase())
            .ok_or_else(|| format!("the spec has no {method} {path}"))
    }

    /// The JSON schema of `method path`'s request body.
    pub fn request_schema(&self, method: &str, path: &str) -> Result<&Value, String> {
        let op = self.operation(method, path)?;
        let body = op
            .get("requestBody")
            .ok_or_else(|| format!("{method} {path} takes no request body"))?;
        json_schema(self.resolve(body)?)
            .ok_or_else(|| format!("{method} {path}: no JSON request body"))
    }

    /// The JSON schema of `method path`'s answer with `status` (the exact
    /// code, else `4XX`-style, else `default`).
    pub fn response_schema(&self, method: &str, path: &str, status: u16) -> Result<&Value, String> {
        let op = self.operation(method, path)?;
        let responses = op
            .get("responses")
            .ok_or_else(|| format!("{method} {path} has no responses"))?;
        let code = status.to_string();
        let range = format!("{}XX", status / 100);
        let resp = responses
            .get(&code)
            .or_else(|| responses.get(&range))
            .or_else(|| responses.get("default"))
            .ok_or_else(|| format!("{method} {path} does not answer {status}"))?;
        json_schema(self.resolve(resp)?)
            .ok_or_else(|| format!("{method} {path} {status}: no JSON body"))
    }

    /// Where `body` breaks the schema of `method path`'s request body.
    pub fn check_request(&self, method: &str, path: &str, body: &Value) -> Vec<String> {
        match self.request_schema(method, path) {
            Ok(schema) => self.validate(schema, body),
            Err(e) => vec![e],
        }
    }

    /// Where `body` breaks the schema of `method path`'s `status` answer.
    pub fn check_response(
        &self,
        method: &str,
        path: &str,
        status: u16,
        body: &Value,
    ) -> Vec<String> {
        match self.response_schema(method, path, status) {
            Ok(schema) => self.validate(schema, body),
            Err(e) => vec![e],
        }
    }

    /// The schema at `#/components/schemas/{name}`.
    pub fn component(&self, name: &str) -> &Value {
        self.doc
            .pointer(&format!("/components/schemas/{name}"))
            .unwrap_or_else(|| panic!("the spec has no schema {name}"))
    }

    /// Every way `value` breaks `schema` (empty: valid), each with its JSON path.
    pub fn validate(&self, schema: &Value, value: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        self.check(schema, value, "$", 0, &mut errors);
        errors
    }

    fn check(
        &self,
        schema: &Value,
        value: &Value,
        at: &str,
        depth: usize,
        errors: &mut Vec<String>,
    ) {
        if depth > MAX_DEPTH {
            errors.push(format!("{at}: schemas nest too deep"));
            return;
        }
        let schema = match self.resolve(schema) {
            Ok(s) => s,
            Err(e) => {
                errors.push(format!("{at}: {e}"));
                return;
            }
        };
        // `true`/`{}` accept anything; `false` nothing.
        match schema {
            Value::Bool(true) => return,
            Value::Bool(false) => {
                errors.push(format!("{at}: no value is allowed here"));
                return;
            }
            Value::Object(_) => {}
            _ => {
                errors.push(format!("{at}: the schema is not an object"));
                return;
            }
        }
        let nullable = schema.get("nullable").and_then(Value::as_bool) == Some(true);
        if value.is_null() && nullable {
            return;
        }
        if let Some(t) = schema.get("type") {
            let types: Vec<&str> = match t {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => vec![],
            };
            if !types.is_empty() && !types.iter().any(|t| has_type(value, t)) {
                errors.push(format!(
                    "{at}: {} is not of type {}",
                    short(value),
                    types.join(" or ")
                ));
                return;
            }
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
            && !allowed.contains(value)
            && !(value.is_null() && nullable)
        {
            errors.push(format!(
                "{at}: {} is not one of {}",
                short(value),
                Value::Array(allowed.clone())
            ));
        }
        if let Some(c) = schema.get("const")
            && c != value
        {
            errors.push(format!("{at}: {} is not {c}", short(value)));
        }
        if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
            for s in all {
                self.check(s, value, at, depth + 1, errors);
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(choices) = schema.get(key).and_then(Value::as_array) {
                let mut reasons = Vec::new();
                let fits = choices.iter().any(|s| {
                    let mut e = Vec::new();
                    self.check(s, value, at, depth + 1, &mut e);
                    let ok = e.is_empty();
                    reasons.extend(e);
                    ok
                });
                if !fits {
                    errors.push(format!("{at}: fits none of {key} ({})", reasons.join("; ")));
                }
            }
        }
        if let Some(n) = value.as_f64() {
            let bound = |k: &str| schema.get(k).and_then(Value::as_f64);
            if let Some(min) = bound("minimum")
                && n < min
            {
                errors.push(format!("{at}: {n} is below the minimum {min}"));
            }
            if let Some(max) = bound("maximum")
                && n > max
            {
                errors.push(format!("{at}: {n} is above the maximum {max}"));
            }
            if let Some(min) = bound("exclusiveMinimum")
                && n <= min
            {
                errors.push(format!("{at}: {n} is not above {min}"));
            }
            if let Some(max) = bound("exclusiveMaximum")
                && n >= max
            {
                errors.push(format!("{at}: {n} is not below {max}"));
            }
        }
        if let Some(s) = value.as_str() {
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
        if let Some(items) = value.as_array() {
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
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    self.check(item_schema, item, &format!("{at}[{i}]"), depth + 1, errors);
                }
            }
        }
        if let Some(object) = value.as_object() {
            if let Some(required) = schema.get("required").and_then(Value::as_array) {
                for r in required.iter().filter_map(Value::as_str) {
                    if !object.contains_key(r) {
                        errors.push(format!("{at}: {r} is required"));
                    }
                }
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            for (k, v) in object {
                let here = format!("{at}.{k}");
                match properties.and_then(|p| p.get(k)) {
                    Some(s) => self.check(s, v, &here, depth + 1, errors),
                    None => match additional {
                        Some(Value::Bool(false)) => {
                            errors.push(format!("{here}: not a property the schema allows"))
                        }
                        Some(s @ Value::Object(_)) => self.check(s, v, &here, depth + 1, errors),
                        _ => {}
                    },
                }
            }
        }
    }
}

/// The `application/json` schema of a request body or response object.
fn json_schema(v: &Value) -> Option<&Value> {
    let content = v.get("content")?;
    content
        .get("application/json")
        .or_else(|| {
            content
                .as_object()?
                .iter()
                .find(|(k, _)| k.contains("json"))
                .map(|(_, v)| v)
        })?
        .get("schema")
}

fn has_type(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 80 {
        format!("{}…", s.chars().take(80).collect::<String>())
    } else {
        s
    }
}
