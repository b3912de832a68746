//! The image an `edit` or `cutout` works on, as a request names it (`"image"` in
//! `POST /v1/tasks` and in a set's `…/candidates`): an artifact, an upload, a task's image, or
//! any of the three ids; resolved and checked before anything is recorded.

use serde::Deserialize;
use utoipa::ToSchema;

use super::AppState;
use super::error::ApiError;
use crate::domain::operation::{Source, SourceKind};

/// Which stored image an operation works on: exactly one of the three.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageRef {
    /// An image a task made (`artifacts[].id`).
    pub artifact: Option<String>,
    /// An uploaded photo (`POST /v1/uploads`).
    pub upload: Option<String>,
    /// A task whose (first) image it is.
    pub task: Option<String>,
    /// Any of the three ids, looked up in that order (what the CLI's `--image ID` sends).
    pub id: Option<String>,
}

/// The stored image `r` names, checked: exactly one kind of id, and a task that has an image.
pub(crate) async fn resolve_image(state: &AppState, r: ImageRef) -> Result<Source, ApiError> {
    if let (None, None, None, Some(id)) = (&r.artifact, &r.upload, &r.task, &r.id) {
        let store = state.engine().store();
        if store.artifact(id.clone()).await?.is_some() {
            return Ok(Source { kind: SourceKind::Artifact, id: id.clone() });
        }
        if store.upload(id.clone()).await?.is_some() {
            return Ok(Source { kind: SourceKind::Upload, id: id.clone() });
        }
        let task = ImageRef { artifact: None, upload: None, task: Some(id.clone()), id: None };
        return Box::pin(resolve_image(state, task)).await;
    }
    match (r.artifact, r.upload, r.task) {
        (Some(id), None, None) => Ok(Source { kind: SourceKind::Artifact, id }),
        (None, Some(id), None) => Ok(Source { kind: SourceKind::Upload, id }),
        (None, None, Some(task)) => {
            let t = state.engine().store().get_task(task.clone()).await?.ok_or_else(|| {
                ApiError::invalid(format!("there is no image, photo or job {task}; nothing was recorded or sent"))
            })?;
            match t.artifacts.first() {
                Some(a) => Ok(Source { kind: SourceKind::Artifact, id: a.id.clone() }),
                None => Err(ApiError::invalid(format!(
                    "task {task} has no image yet (it is {}); edit or cut out an image once it has one",
                    t.status.as_str()
                ))),
            }
        }
        _ => Err(ApiError::invalid("`image` names exactly one of artifact, upload, task or id: {\"artifact\": ID}")),
    }
}
