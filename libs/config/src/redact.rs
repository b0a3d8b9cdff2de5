//! URLs fit for a log line or an error message: credentials replaced by
//! `***`.

/// `url` with any password replaced by `***`:
/// `postgres://runyard:***@db:5432/runyard`. A lone user part may itself be
/// a token (`nats://<token>@host`), so it is hidden too. Text that is not a
/// URL with credentials comes back unchanged.
pub fn url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    // The last `@` before the query ends the credentials, even when an
    // unencoded `/` in a password makes the authority look shorter.
    let head_end = rest.find(['?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..head_end].rfind('@') else {
        return url.to_owned();
    };
    let user = match rest[..at].split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        // Only a password-less user name is safe to show, and it cannot be
        // told apart from a token.
        None => "***".to_owned(),
    };
    format!("{}{user}{}", &url[..scheme_end + 3], &rest[at..])
}

/// A comma-separated list of URLs (NATS servers) with each one's
/// credentials redacted by [`url`].
pub fn urls(list: &str) -> String {
    list.split(',').map(url).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_leave_a_url() {
        for (given, shown) in [
            (
                "postgres://runyard:s3cret@db:5432/runyard",
                "postgres://runyard:***@db:5432/runyard",
            ),
            (
                "postgres://u:p@ss:w0rd@h/db?sslmode=require",
                "postgres://u:***@h/db?sslmode=require",
            ),
            ("nats://tok3n@nats:4222", "nats://***@nats:4222"),
            ("nats://u:a/b@nats:4222", "nats://u:***@nats:4222"),
            (
                "postgres://postgres@127.0.0.1:5432/runyard",
                "postgres://***@127.0.0.1:5432/runyard",
            ),
            ("postgres://h/db?user=a", "postgres://h/db?user=a"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(url(given), shown, "{given}");
        }
    }

    #[test]
    fn every_server_of_a_list_is_redacted() {
        assert_eq!(
            urls("nats://user:pw@nats:4222"),
            "nats://user:***@nats:4222"
        );
        assert_eq!(urls("tls://s3cr3t@nats:4222"), "tls://***@nats:4222");
        assert_eq!(
            urls("nats://a:b@n1:4222,nats://a:b@n2:4222"),
            "nats://a:***@n1:4222,nats://a:***@n2:4222"
        );
        assert_eq!(urls("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
    }
}
