//! Can this node's verdict use the API server? What `verdict doctor` asks:
//! the server answers (its version), and RBAC allows what verdict does,
//! asked with SelfSubjectAccessReviews (list and watch of Services,
//! EndpointSlices, Nodes and ServiceCIDRs; create and patch of Events).

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

use crate::watch::{ApiSource, SourceError};

/// What verdict needs: (verb, API group, resource).
pub const NEEDED: [(&str, &str, &str); 10] = [
    ("list", "", "services"),
    ("watch", "", "services"),
    ("list", "discovery.k8s.io", "endpointslices"),
    ("watch", "discovery.k8s.io", "endpointslices"),
    ("list", "", "nodes"),
    ("watch", "", "nodes"),
    ("list", "networking.k8s.io", "servicecidrs"),
    ("watch", "networking.k8s.io", "servicecidrs"),
    ("create", "events.k8s.io", "events"),
    ("patch", "events.k8s.io", "events"),
];

/// One permission and the server's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permission {
    /// `list`, `watch`, …
    pub verb: &'static str,
    /// The API group (`""` for the core group).
    pub group: &'static str,
    /// The resource.
    pub resource: &'static str,
    /// Allowed, denied (with the server's reason), or not asked (why).
    pub answer: Result<bool, String>,
    /// The reason the server gave, if any.
    pub reason: Option<String>,
}

/// The server's version and every permission in [`NEEDED`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// `major.minor` (`gitVersion` when given), or why it could not be read.
    pub version: Result<String, String>,
    /// The permissions.
    pub permissions: Vec<Permission>,
}

/// Asks the API server of `src`. Fails only if no client can be built
/// (bad kubeconfig, bad `--master`); an unreachable server is an answer.
pub fn check(src: &ApiSource) -> Result<Access, SourceError> {
    let (rt, client) = crate::client::on_own_runtime(src)?;
    rt.block_on(async move {
        let version = client
            .apiserver_version()
            .await
            .map(|v| {
                if v.git_version.is_empty() {
                    format!("{}.{}", v.major, v.minor)
                } else {
                    v.git_version
                }
            })
            .map_err(|e| e.to_string());
        let reviews: Api<SelfSubjectAccessReview> = Api::all(client);
        let mut permissions = Vec::new();
        for (verb, group, resource) in NEEDED {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        verb: Some(verb.into()),
                        group: Some(group.into()),
                        resource: Some(resource.into()),
                        ..ResourceAttributes::default()
                    }),
                    ..SelfSubjectAccessReviewSpec::default()
                },
                ..SelfSubjectAccessReview::default()
            };
            let (answer, reason) = match reviews.create(&PostParams::default(), &review).await {
                Ok(r) => match r.status {
                    Some(s) => (Ok(s.allowed), s.reason),
                    None => (Err("the review came back without a status".into()), None),
                },
                Err(e) => (Err(e.to_string()), None),
            };
            permissions.push(Permission {
                verb,
                group,
                resource,
                answer,
                reason,
            });
        }
        Ok(Access {
            version,
            permissions,
        })
    })
}
