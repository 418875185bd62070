//! Errors in the OpenAI shape, `{"error": {"message", "type", "param", "code"}}`, and on the Anthropic Messages
//! routes in Anthropic's, `{"type": "error", "error": {"type", "message"}}`, each with a matching status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// One error reply.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 `invalid_request_error` about `param`.
    pub fn invalid(param: impl Into<Option<String>>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.into(),
            code: None,
        }
    }

    /// 400 for a field: `"<field>: <message>"`.
    pub fn field(field: &str, message: impl std::fmt::Display) -> ApiError {
        ApiError::invalid(Some(field.to_string()), format!("{field}: {message}"))
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key: send `Authorization: Bearer <key>` or `x-api-key: <key>` with the \
                      server's --api-key"
                .into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("not_found"),
        }
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body is larger than the server's limit of {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    /// 408: the body did not arrive in time (a stalled or trickling client).
    pub fn body_timeout(limit: std::time::Duration) -> ApiError {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!("the request body did not arrive within {}s", limit.as_secs_f64()),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_timeout"),
        }
    }

    /// 503: the server already serves its most connections (`--max-connections`).
    pub fn too_many_connections(max: usize) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!("the server is serving its limit of {max} connections; retry later"),
            kind: "service_unavailable",
            param: None,
            code: Some("too_many_connections"),
        }
    }

    pub fn busy(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full"),
        }
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "service_unavailable",
            param: None,
            code: Some("shutting_down"),
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl ApiError {
    /// Anthropic's `error.type` for this status: 400 `invalid_request_error` (and other 4xx), 401
    /// `authentication_error`, 403 `permission_error`, 404 `not_found_error`, 413 `request_too_large`, 429
    /// `rate_limit_error`, 503 and 529 `overloaded_error`, 500 (and other 5xx) `api_error`.
    pub fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body in Anthropic's shape.
    pub fn anthropic_body(&self) -> serde_json::Value {
        json!({"type": "error", "error": {"type": self.anthropic_type(), "message": self.message}})
    }

    /// The response in Anthropic's shape (same status).
    pub fn into_anthropic(self) -> Response {
        (self.status, axum::Json(self.anthropic_body())).into_response()
    }

    /// The response (for places that cannot use `IntoResponse` through a `?`).
    pub fn into_response_inner(self) -> Response {
        self.into_response()
    }
}

/// An [`ApiError`] answered in Anthropic's shape (the `/v1/messages` routes); `?` converts.
#[derive(Clone, Debug, PartialEq)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.into_anthropic()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_has_the_openai_shape() {
        let e = ApiError::field("temperature", "must be between 0 and 2").with_code("invalid_value");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let b = e.body();
        assert_eq!(b["error"]["message"], "temperature: must be between 0 and 2");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["param"], "temperature");
        assert_eq!(b["error"]["code"], "invalid_value");
        assert!(ApiError::unauthorized().body()["error"]["param"].is_null());
    }

    #[test]
    fn anthropic_shape_and_types() {
        let b = ApiError::field("max_tokens", "is required").anthropic_body();
        assert_eq!(
            b,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: is required"}})
        );
        let kinds: Vec<(u16, &str)> = [
            ApiError::unauthorized(),
            ApiError::not_found("x"),
            ApiError::too_large(1),
            ApiError::busy("x"),
            ApiError::internal("x"),
            ApiError::unavailable("x"),
            ApiError { status: StatusCode::FORBIDDEN, ..ApiError::internal("x") },
            ApiError { status: StatusCode::from_u16(529).unwrap(), ..ApiError::internal("x") },
            ApiError { status: StatusCode::UNPROCESSABLE_ENTITY, ..ApiError::internal("x") },
        ]
        .iter()
        .map(|e| (e.status.as_u16(), e.anthropic_type()))
        .collect();
        assert_eq!(
            kinds,
            [
                (401, "authentication_error"),
                (404, "not_found_error"),
                (413, "request_too_large"),
                (429, "rate_limit_error"),
                (500, "api_error"),
                (503, "overloaded_error"),
                (403, "permission_error"),
                (529, "overloaded_error"),
                (422, "invalid_request_error"),
            ]
        );
    }
}
