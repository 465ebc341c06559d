//! Lists in pages: the one way this plugin walks a collection that may be large. A page bounds
//! the response body; the continue token pins the first page's revision, so the pages are one
//! snapshot, as consistent as one list. A token that expired (410: the revision was compacted)
//! starts the walk again.

use kube::api::{Api, ListParams};
use kube::core::Resource;
use serde::de::DeserializeOwned;

use crate::k8s::client::lean;

/// Objects per page. A list of 25,000 PortAllocations in one response held the whole body and
/// every decoded object at once (640 MB).
pub const PAGE: u32 = 500;

/// What a walk hands its caller.
pub enum Paged<K> {
    /// The next object.
    Object(K),
    /// The walk starts over (an expired token): forget what it handed so far.
    Restart,
}

/// Call `each` with every object `params` selects, page by page.
pub async fn for_each_page<K>(
    api: &Api<K>,
    params: &ListParams,
    mut each: impl FnMut(Paged<K>),
) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    'again: loop {
        let mut page = params.clone().limit(params.limit.unwrap_or(PAGE));
        loop {
            let list = match api.list(&page).await {
                Ok(list) => list,
                Err(kube::Error::Api(status))
                    if status.code == 410 && page.continue_token.is_some() =>
                {
                    each(Paged::Restart);
                    continue 'again;
                }
                Err(e) => return Err(e),
            };
            list.items.into_iter().for_each(|k| each(Paged::Object(k)));
            match list.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => page = page.continue_token(&token),
                None => return Ok(()),
            }
        }
    }
}

/// Every object `params` selects, without `managedFields` ([`lean`]).
pub async fn list_all<K>(api: &Api<K>, params: &ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    for_each_page(api, params, |paged| match paged {
        Paged::Object(object) => items.push(lean(object)),
        Paged::Restart => items.clear(),
    })
    .await?;
    Ok(items)
}
