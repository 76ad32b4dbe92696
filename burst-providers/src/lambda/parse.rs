//! Reading Lambda's answers: instances, the catalog, error bodies; and the
//! checks on what is sent (ids, tag keys, images).

use super::*;

/// An instance as Lambda described it, and whether Lambda gave its tags.
pub(super) struct Parsed {
    pub(super) instance: Instance,
    pub(super) tagged: bool,
}

impl Parsed {
    pub(super) fn matches(&self, key: &str, value: &str) -> bool {
        if self.tagged {
            self.instance.tags.get(key).map(String::as_str) == Some(value)
        } else {
            // A name is unique to one launch, so it can stand only for a tag
            // unique to one launch, never for one many instances share.
            key != TAG_MANAGED_BY
                && key != TAG_HUB
                && !value.is_empty()
                && self.instance.name == value
        }
    }
}

/// Refuses an id that cannot be Lambda's (empty, too long, or with characters
/// beyond letters, digits, `-` and `_`), before it becomes part of a URL.
pub(super) fn check_id(what: &str, id: &str) -> Result<(), ProviderError> {
    if id.is_empty()
        || id.len() > MAX_ID_CHARS
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        let shown: String = id.chars().take(40).collect();
        return Err(ProviderError::permanent(
            KIND,
            format!("{what}: {shown:?} is not a Lambda instance id"),
        ));
    }
    Ok(())
}

pub(super) fn malformed(what: &str, why: &str) -> ProviderError {
    ProviderError::retryable(KIND, format!("{what}: the answer is malformed: {why}"))
}

/// `text` with every occurrence of `secret` cut out.
pub(super) fn redact(text: &str, secret: &str) -> String {
    if secret.is_empty() {
        text.to_string()
    } else {
        text.replace(secret, "…")
    }
}

/// The code and message of Lambda's `{"error": {"code", "message"}}` body.
pub(super) fn api_error(body: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(body).ok()?;
    let e = v.get("error")?;
    let code = e.get("code")?.as_str()?.to_string();
    let message = e
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Some((code, message))
}

/// Lambda's tag key rule: `^[a-z][a-z0-9-:]+$`, at most [`MAX_TAG_KEY_CHARS`].
pub(super) fn valid_tag_key(key: &str) -> bool {
    let mut chars = key.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && key.len() >= 2
        && key.len() <= MAX_TAG_KEY_CHARS
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == ':')
}

/// The launch's `image`: `id:<id>` picks an image by its id, anything else
/// (optionally written `family:<name>`) by its family name.
pub(super) fn image_spec(image: &str) -> Value {
    if let Some(id) = image.strip_prefix("id:") {
        json!({ "id": id.trim() })
    } else {
        let family = image.strip_prefix("family:").unwrap_or(image);
        json!({ "family": family.trim() })
    }
}

/// Axle's state for Lambda's status; unknown ones are kept as named.
pub(super) fn state(status: &str) -> InstanceState {
    match status {
        "booting" => InstanceState::Pending,
        "active" => InstanceState::Running,
        "terminating" => InstanceState::Stopping,
        "terminated" => InstanceState::Terminated,
        "preempted" => InstanceState::Interrupted,
        other => InstanceState::Other(other.to_string()),
    }
}

pub(super) fn parse_instance(what: &str, v: &Value) -> Result<Parsed, ProviderError> {
    let id = v
        .get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| malformed(what, "an instance has no id"))?;
    let status = v
        .get("status")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(what, "an instance has no status"))?;
    let text = |pointer: &str| {
        v.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (tags, tagged) = match v.get("tags") {
        None | Some(Value::Null) => (BTreeMap::new(), false),
        Some(Value::Array(items)) => (
            items
                .iter()
                .filter_map(|t| {
                    Some((
                        t.get("key")?.as_str()?.to_string(),
                        t.get("value")?.as_str()?.to_string(),
                    ))
                })
                .collect(),
            true,
        ),
        Some(_) => return Err(malformed(what, "an instance's tags are not a list")),
    };
    Ok(Parsed {
        instance: Instance {
            id: id.to_string(),
            name: text("/name"),
            instance_type: text("/instance_type/name"),
            region: text("/region/name"),
            state: state(status),
            tags,
        },
        tagged,
    })
}

pub(super) fn parse_catalog(v: &Value, regions: &[String]) -> Result<Vec<Offer>, ProviderError> {
    const WHAT: &str = "reading the instance types";
    let data = v
        .get("data")
        .and_then(Value::as_object)
        .ok_or_else(|| malformed(WHAT, "it has no data object"))?;
    let mut offers = Vec::new();
    for (key, entry) in data {
        let bad = |why: &str| malformed(WHAT, &format!("instance type {key}: {why}"));
        let it = entry
            .get("instance_type")
            .filter(|t| t.is_object())
            .ok_or_else(|| bad("no instance_type"))?;
        let name = it
            .get("name")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("no name"))?;
        let description = it
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let gpu_description = it
            .get("gpu_description")
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty());
        let cents = it
            .get("price_cents_per_hour")
            .and_then(|p| match p {
                Value::Number(n) => n.as_u64(),
                // An older API wrote the price as a string of digits.
                Value::String(s) => s.trim().parse::<u64>().ok(),
                _ => None,
            })
            .filter(|c| *c <= MAX_PRICE_CENTS_PER_HOUR)
            .ok_or_else(|| {
                bad(&format!(
                    "price_cents_per_hour is not a whole number of cents up to {MAX_PRICE_CENTS_PER_HOUR}"
                ))
            })?;
        let listed = entry
            .get("regions_with_capacity_available")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no regions_with_capacity_available list"))?;
        let gpus = match it.pointer("/specs/gpus") {
            Some(n) => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad("specs.gpus is not a count"))?,
            None => gpus_from_name(name)
                .or_else(|| gpus_from_description(description))
                .unwrap_or(0),
        };
        if gpus == 0 {
            continue;
        }
        let gpu = gpu_description.unwrap_or(description);
        let mut gpu_model = gpu_class(gpu_name(gpu));
        if gpu_model.is_empty() {
            gpu_model = name.split('_').nth(2).unwrap_or(name).to_ascii_uppercase();
        }
        let gpu_memory_mb = gpu_description
            .and_then(gpu_memory_gb)
            .or_else(|| gpu_memory_gb(description))
            .and_then(|gb| gb.checked_mul(1024))
            .unwrap_or(0);
        for region in listed {
            let region = region
                .get("name")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| bad("a region has no name"))?;
            if !regions.is_empty() && !regions.iter().any(|r| r == region) {
                continue;
            }
            offers.push(Offer {
                provider: KIND,
                instance_type: name.to_string(),
                gpu_model: gpu_model.clone(),
                gpus,
                gpu_memory_mb,
                region: region.to_string(),
                price_per_hour: Usd::from_cents(cents),
                spot: false,
                available: true,
            });
        }
    }
    offers.sort_by(|a, b| (&a.instance_type, &a.region).cmp(&(&b.instance_type, &b.region)));
    offers.dedup_by(|a, b| a.instance_type == b.instance_type && a.region == b.region);
    Ok(offers)
}

/// The GPU count of a `gpu_8x_h100_sxm5`-style name.
pub(super) fn gpus_from_name(name: &str) -> Option<u32> {
    name.strip_prefix("gpu_")?
        .split('_')
        .next()?
        .strip_suffix('x')?
        .parse()
        .ok()
}

/// The GPU count of an `8x H100 (80 GB SXM5)`-style description.
pub(super) fn gpus_from_description(description: &str) -> Option<u32> {
    description
        .split_whitespace()
        .next()?
        .strip_suffix('x')?
        .parse()
        .ok()
}

/// The GPU's name in a description: `8x H100 (80 GB SXM5)` → `H100`.
pub(super) fn gpu_name(description: &str) -> &str {
    let d = description.trim();
    let d = match d.split_once(char::is_whitespace) {
        Some((count, rest)) if gpus_from_description(count).is_some() => rest,
        _ => d,
    };
    d.split('(').next().unwrap_or(d).trim()
}

/// The GPU memory in a description: `8x H100 (80 GB SXM5)` → 80.
pub(super) fn gpu_memory_gb(description: &str) -> Option<u64> {
    let inside = description.split_once('(')?.1;
    let inside = inside.split(')').next().unwrap_or(inside);
    let mut words = inside.split_whitespace();
    let first = words.next()?;
    if let Some(n) = first
        .strip_suffix("GB")
        .or_else(|| first.strip_suffix("GiB"))
        .filter(|n| !n.is_empty())
    {
        return n.parse().ok();
    }
    let unit = words.next()?;
    if unit.starts_with("GB") || unit.starts_with("GiB") {
        first.parse().ok()
    } else {
        None
    }
}
