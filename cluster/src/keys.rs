//! The etcd key layout of a Dolphin cluster. Every process derives keys here so the layout has
//! one definition: `/dolphin/<cluster>/workers/<role>/<id>` for worker records and
//! `/dolphin/<cluster>/tables/` for shared tables, `/dolphin/<cluster>/responses/<id>` for the
//! Responses API's kept responses.

use crate::worker::{Role, WorkerId};

/// Prefix of every worker record in `cluster` (ends with `/`, so a prefix watch on cluster `a`
/// never sees cluster `ab`).
pub fn workers_prefix(cluster: &str) -> String {
    format!("/dolphin/{cluster}/workers/")
}

/// Key of one worker's record.
pub fn worker_key(cluster: &str, role: Role, id: &WorkerId) -> String {
    format!("{}{}/{}", workers_prefix(cluster), role.as_str(), id)
}

/// Prefix of the cluster's shared tables (ends with `/`).
pub fn tables_prefix(cluster: &str) -> String {
    format!("/dolphin/{cluster}/tables/")
}

/// Prefix of the Responses API's responses kept in etcd (ends with `/`).
pub fn responses_prefix(cluster: &str) -> String {
    format!("/dolphin/{cluster}/responses/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        assert_eq!(workers_prefix("prod"), "/dolphin/prod/workers/");
        assert_eq!(
            worker_key("prod", Role::Decode, &WorkerId::from("decode-0000abcd")),
            "/dolphin/prod/workers/decode/decode-0000abcd"
        );
        assert_eq!(tables_prefix("prod"), "/dolphin/prod/tables/");
        assert_eq!(responses_prefix("prod"), "/dolphin/prod/responses/");
        assert!(
            worker_key("a", Role::Prefill, &WorkerId::from("x")).starts_with(&workers_prefix("a"))
        );
        assert!(!workers_prefix("ab").starts_with(&workers_prefix("a")));
    }
}
