//! Asking the caller mid-call: an elicitation that reaches the caller of this call across the
//! mesh (docs/bus.md, "Asking"). With several calls in flight on one child the node must know
//! which call a request belongs to: every `tools/call` of a caller that answers carries
//! `_meta["mesh/call"]`, and these helpers copy it onto the request (sdk/COMMON.md, "Asking").
//! A caller that cannot answer makes the request fail at once (`ServiceError::McpError` with the
//! node's JSON-RPC error), never a hang.
//!
//! The request is sent with `Peer::send_request` rather than rmcp's `create_elicitation`: that
//! one sits behind rmcp's `elicitation` feature, which only adds the `url` crate (and its IDNA
//! tables) to every bundle, while the request and result types are there without it.

use rmcp::{
    model::{
        ClientResult, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationSchema,
        MetaObject, RequestMetaObject, ServerRequest,
    },
    serde_json::{Map, Value},
    service::ServiceError,
};

use crate::Call;

/// The `_meta` key of the call reference the node puts on a `tools/call` whose caller answers.
pub const CALL_REF_KEY: &str = "mesh/call";

/// The call reference in a request's `_meta`: an integer only (not a bool, float or string).
pub(crate) fn call_ref_of(meta: &Map<String, Value>) -> Option<i64> {
    meta.get(CALL_REF_KEY).and_then(Value::as_i64)
}

/// The `_meta` of an elicitation: the call reference, when the call had one.
fn meta_for(call_ref: Option<i64>) -> Option<RequestMetaObject> {
    let mut map = Map::new();
    map.insert(CALL_REF_KEY.into(), call_ref?.into());
    Some(RequestMetaObject(MetaObject(map)))
}

impl Call {
    /// Ask the caller to fill a form (`schema`: an object of primitive properties, e.g.
    /// `ElicitationSchema::builder().required_bool("ok").build()`); the result's `action` is
    /// accept, decline or cancel, `content` the answer when accepted.
    pub async fn elicit(
        &self,
        message: &str,
        schema: ElicitationSchema,
    ) -> Result<ElicitResult, ServiceError> {
        self.ask(ElicitRequestParams::FormElicitationParams {
            meta: meta_for(self.call_ref),
            message: message.into(),
            requested_schema: schema,
        })
        .await
    }

    /// Send the caller's user to `url` (URL mode: what happens there never passes the mesh).
    pub async fn elicit_url(
        &self,
        message: &str,
        url: &str,
        elicitation_id: &str,
    ) -> Result<ElicitResult, ServiceError> {
        self.ask(ElicitRequestParams::UrlElicitationParams {
            meta: meta_for(self.call_ref),
            message: message.into(),
            url: url.into(),
            elicitation_id: elicitation_id.into(),
        })
        .await
    }

    async fn ask(&self, params: ElicitRequestParams) -> Result<ElicitResult, ServiceError> {
        let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
        match self.peer.send_request(request).await? {
            ClientResult::ElicitResult(result) => Ok(result),
            _ => Err(ServiceError::UnexpectedResponse),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::serde_json::{self, json};

    #[test]
    fn only_an_integer_is_a_call_reference() {
        let of = |v: Value| call_ref_of(json!({ CALL_REF_KEY: v }).as_object().unwrap());
        assert_eq!(of(json!(7)), Some(7));
        for bad in [json!(true), json!(7.5), json!("7"), json!(null)] {
            assert_eq!(of(bad), None);
        }
        assert_eq!(call_ref_of(&Map::new()), None);
    }

    #[test]
    fn a_form_carries_the_reference_and_the_schema() {
        let params = ElicitRequestParams::FormElicitationParams {
            meta: meta_for(Some(7)),
            message: "Ship it?".into(),
            requested_schema: ElicitationSchema::builder()
                .required_bool("ok")
                .build()
                .unwrap(),
        };
        let wire = serde_json::to_value(&params).unwrap();
        assert_eq!(wire["_meta"], json!({ CALL_REF_KEY: 7 }));
        assert_eq!(wire["message"], "Ship it?");
        assert_eq!(
            (
                &wire["requestedSchema"]["properties"]["ok"]["type"],
                &wire["requestedSchema"]["required"]
            ),
            (&json!("boolean"), &json!(["ok"]))
        );
        // Without a reference (a call no answering caller made) there is no _meta at all.
        assert!(meta_for(None).is_none());
    }
}
