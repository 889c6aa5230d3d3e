//! What an API server's refusal means to a controller.

/// Whether `error` says the object does not exist (404).
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// Whether `error` says the object changed since it was read, or already exists (409).
pub fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// Whether `error` says this client may not do what it asked (403).
pub fn is_forbidden(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 403)
}

/// Whether `error` says the object is gone or changed since it was read (404 or 409): a write
/// based on what was read no longer applies, and the next look decides again.
pub fn is_stale(error: &kube::Error) -> bool {
    is_not_found(error) || is_conflict(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status::failure("refused", "Refused").with_code(code)))
    }

    #[test]
    fn refusals_are_told_apart() {
        assert!(is_not_found(&status(404)) && !is_conflict(&status(404)));
        assert!(is_conflict(&status(409)) && !is_not_found(&status(409)));
        assert!(is_forbidden(&status(403)) && !is_forbidden(&status(404)));
        assert!(is_stale(&status(404)) && is_stale(&status(409)));
        assert!(!is_stale(&status(422)) && !is_stale(&status(500)));
    }
}
