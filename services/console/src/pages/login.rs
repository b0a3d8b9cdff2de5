//! The login page: one field for a token of `RUNYARD_CONSOLE_TOKENS`;
//! behind a trusted proxy nobody sees it.

use maud::{Markup, html};

use crate::view;

/// Where to go after signing in: a path of this console, never another
/// site (`//host`, `http://…`).
pub fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.contains('\\')
                && n.len() <= 2048 =>
        {
            n.to_owned()
        }
        _ => "/queue".to_owned(),
    }
}

/// The page: `message` says why it is shown, `tokens` whether token
/// logins are on.
pub fn form(message: &str, next: &str, tokens: bool) -> Markup {
    view::bare(
        "Sign in to runyard",
        &html! {
            p role="alert" { (message) }
            @if tokens {
                form method="post" action="/login" {
                    label for="token" { "Console token" }
                    input #token type="password" name="token" autocomplete="current-password" required;
                    input type="hidden" name="next" value=(next);
                    button type="submit" { "Sign in" }
                }
                p.muted { "A token of RUNYARD_CONSOLE_TOKENS. Scripts may send it as " code { "Authorization: Bearer <token>" } "." }
            } @else {
                p.muted { "This console is signed into through its reverse proxy." }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_consoles_paths_are_gone_to() {
        assert_eq!(safe_next(Some("/jobs/gitlab/g/1")), "/jobs/gitlab/g/1");
        for away in [
            "//evil.example/x",
            "https://evil.example/",
            "/\\evil",
            "pools",
        ] {
            assert_eq!(safe_next(Some(away)), "/queue", "{away}");
        }
        assert_eq!(safe_next(None), "/queue");
    }
}
