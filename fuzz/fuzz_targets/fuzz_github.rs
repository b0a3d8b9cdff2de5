//! `normalize_github`. Selector bits: 0-1 `X-GitHub-Event`, 2-4
//! `Content-Type` (3: the body is form-encoded into `payload` here, 4: sent
//! as form-encoded as it is), 5 received late, 6-7
//! `X-GitHub-Enterprise-Host`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use runyard_forge::{GithubDelivery, normalize_github};
use runyard_fuzz::{bits, invariants, received_at, split};

const EVENTS: [Option<&str>; 4] = [
    Some("workflow_job"),
    Some("workflow_job"),
    Some("ping"),
    None,
];
const FORM: &str = "application/x-www-form-urlencoded";
const CONTENT_TYPES: [Option<&str>; 8] = [
    None,
    Some("application/json"),
    Some("application/json; charset=utf-8"),
    Some(FORM),
    Some(FORM),
    Some(""),
    Some("text/plain"),
    Some("Application/JSON"),
];
const ENTERPRISE_HOSTS: [Option<&str>; 4] = [
    None,
    Some("GHES.Corp.example:8443"),
    Some("bad host"),
    Some(" "),
];

fuzz_target!(|data: &[u8]| {
    let (selector, body) = split(data);
    let content = bits(selector, 2, 3);
    let encoded;
    let body = match std::str::from_utf8(body) {
        Ok(text) if content == 3 => {
            encoded = serde_urlencoded::to_string([("payload", text)]).expect("encodes");
            encoded.as_bytes()
        }
        _ => body,
    };
    let d = GithubDelivery {
        event: EVENTS[bits(selector, 0, 2)],
        delivery_id: Some("72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        hook_id: Some("292430182"),
        enterprise_host: ENTERPRISE_HOSTS[bits(selector, 6, 2)],
        content_type: CONTENT_TYPES[content],
        body,
        received_at: received_at(bits(selector, 5, 1) == 1),
    };
    invariants::github(&d, &normalize_github(&d));
    if d.event == Some("workflow_job") && content < 3 {
        invariants::github_form_matches_json(&d);
    }
});
