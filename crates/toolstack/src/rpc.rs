//! JSON-RPC 2.0 on a Unix socket, one JSON object per line each way.
//!
//! A request names its parameters:
//! `{"jsonrpc":"2.0","id":1,"method":"VM.start","params":{"uuid":"..."}}`.
//! A XenAPI failure is a JSON-RPC error whose `data` is the [`ApiError`]
//! (`{"code":"UUID_INVALID","params":["VM","..."]}`) and whose `message`
//! is its code; the JSON-RPC `code` is -32601 for an unknown method,
//! -32602 for missing or mistyped parameters, -32000 for everything else.
//! A line that is not a request gets -32700 or -32600 with a null id.
//! A request without an id (a notification) is run and not answered.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ApiError, Code};

/// The longest request line a server reads.
pub const MAX_LINE: usize = 1 << 20;

/// JSON-RPC error codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const SERVER_ERROR: i64 = -32000;

/// A request as read off the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    pub jsonrpc: String,
    pub method: String,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub params: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
}

/// The error member of a response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorObject {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<ApiError>,
}

/// A response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    pub jsonrpc: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorObject>,
    pub id: Value,
}

impl Response {
    pub fn ok(id: Value, result: Value) -> Self {
        Response {
            jsonrpc: "2.0".into(),
            result: Some(result),
            error: None,
            id,
        }
    }

    /// A XenAPI failure, with the JSON-RPC code its kind calls for.
    pub fn api_error(id: Value, e: ApiError) -> Self {
        let code = if e.is(Code::MessageMethodUnknown) {
            METHOD_NOT_FOUND
        } else if e.is(Code::MissingParameter)
            || e.is(Code::UnknownParameter)
            || e.is(Code::FieldTypeError)
        {
            INVALID_PARAMS
        } else {
            SERVER_ERROR
        };
        Response {
            jsonrpc: "2.0".into(),
            result: None,
            error: Some(ErrorObject {
                code,
                message: e.code.clone(),
                data: Some(e),
            }),
            id,
        }
    }

    /// A failure of the envelope itself (not a XenAPI error).
    pub fn protocol_error(id: Value, code: i64, message: &str) -> Self {
        Response {
            jsonrpc: "2.0".into(),
            result: None,
            error: Some(ErrorObject {
                code,
                message: message.into(),
                data: None,
            }),
            id,
        }
    }
}

/// Parses one request line: the request, or the response that refuses it.
pub fn parse_request(line: &str) -> Result<Request, Box<Response>> {
    let value: Value = serde_json::from_str(line).map_err(|e| {
        Box::new(Response::protocol_error(
            Value::Null,
            PARSE_ERROR,
            &format!("parse error: {e}"),
        ))
    })?;
    let id = value.get("id").cloned().unwrap_or(Value::Null);
    let req: Request = serde_json::from_value(value).map_err(|e| {
        Box::new(Response::protocol_error(
            id.clone(),
            INVALID_REQUEST,
            &format!("invalid request: {e}"),
        ))
    })?;
    if req.jsonrpc != "2.0" {
        return Err(Box::new(Response::protocol_error(
            id,
            INVALID_REQUEST,
            "invalid request: jsonrpc must be \"2.0\"",
        )));
    }
    if !(req.params.is_null() || req.params.is_object()) {
        return Err(Box::new(Response::protocol_error(
            id,
            INVALID_PARAMS,
            "params must be an object of named parameters",
        )));
    }
    Ok(req)
}

/// Reads the answer to request `id`: its result (a JSON-RPC success
/// always has a `result` member, null included) or its error.
fn parse_response(line: &str, id: u64) -> Result<Value, ClientError> {
    let proto = |m: String| ClientError::Protocol(m);
    let mut v: Value = serde_json::from_str(line).map_err(|e| proto(e.to_string()))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| proto("the answer is not an object".into()))?;
    if obj.get("id") != Some(&Value::from(id)) {
        return Err(proto(format!(
            "answer to request {} while waiting for {id}",
            obj.get("id").unwrap_or(&Value::Null)
        )));
    }
    if let Some(e) = obj.remove("error") {
        let e: ErrorObject = serde_json::from_value(e).map_err(|e| proto(e.to_string()))?;
        return Err(match e.data {
            Some(api) => ClientError::Api(api),
            None => proto(format!("{} ({})", e.message, e.code)),
        });
    }
    obj.remove("result")
        .ok_or_else(|| proto("neither result nor error".into()))
}

/// Why a call failed on the client side.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach toolstackd at {path}: {source} (is `pvio toolstackd` running? set PVIO_TOOLSTACK_SOCKET or PVIO_STATE)")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("talking to toolstackd: {0}")]
    Io(#[from] std::io::Error),
    #[error("toolstackd answered something unexpected: {0}")]
    Protocol(String),
    /// The server refused the call.
    #[error("{0}")]
    Api(#[from] ApiError),
}

/// A blocking client: one connection, one call at a time.
#[derive(Debug)]
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        let writer = stream.try_clone()?;
        Ok(Client {
            reader: BufReader::new(stream),
            writer,
            next_id: 1,
        })
    }

    /// Calls `method` with named `params` (a JSON object, or null).
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let req = Request {
            jsonrpc: "2.0".into(),
            method: method.into(),
            params,
            id: Some(Value::from(id)),
        };
        let mut line =
            serde_json::to_string(&req).map_err(|e| ClientError::Protocol(e.to_string()))?;
        line.push('\n');
        self.writer.write_all(line.as_bytes())?;
        let mut answer = String::new();
        if self.reader.read_line(&mut answer)? == 0 {
            return Err(ClientError::Protocol(
                "the connection closed before the answer".into(),
            ));
        }
        parse_response(&answer, id)
    }

    /// Calls `method` and decodes its result as `T`.
    pub fn call_as<T: DeserializeOwned>(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<T, ClientError> {
        let v = self.call(method, params)?;
        serde_json::from_value(v).map_err(|e| ClientError::Protocol(format!("{method}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked() {
        let r = parse_request(r#"{"jsonrpc":"2.0","id":3,"method":"VM.get_all_records"}"#).unwrap();
        assert_eq!(
            (r.method.as_str(), r.id),
            ("VM.get_all_records", Some(Value::from(3)))
        );
        let bad = |line: &str| parse_request(line).unwrap_err().error.unwrap().code;
        assert_eq!(bad("{"), PARSE_ERROR);
        assert_eq!(bad(r#"{"jsonrpc":"2.0","id":1}"#), INVALID_REQUEST);
        assert_eq!(
            bad(r#"{"jsonrpc":"1.0","id":1,"method":"x"}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            bad(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#),
            INVALID_PARAMS
        );
    }

    #[test]
    fn null_results_are_results() {
        let ok = serde_json::to_string(&Response::ok(Value::from(4), Value::Null)).unwrap();
        assert_eq!(ok, r#"{"jsonrpc":"2.0","result":null,"id":4}"#);
        assert_eq!(parse_response(&ok, 4).unwrap(), Value::Null);
        assert!(matches!(
            parse_response(&ok, 5),
            Err(ClientError::Protocol(_))
        ));
        let err = serde_json::to_string(&Response::api_error(
            Value::from(4),
            ApiError::uuid_invalid("VM", "x"),
        ))
        .unwrap();
        assert!(matches!(
            parse_response(&err, 4),
            Err(ClientError::Api(e)) if e == ApiError::uuid_invalid("VM", "x")
        ));
        assert!(parse_response(r#"{"jsonrpc":"2.0","id":4}"#, 4).is_err());
    }

    #[test]
    fn api_errors_travel_in_data() {
        let r = Response::api_error(Value::from(1), ApiError::uuid_invalid("VM", "x"));
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"UUID_INVALID","data":{"code":"UUID_INVALID","params":["VM","x"]}},"id":1}"#
        );
        let r = Response::api_error(Value::from(2), ApiError::missing_parameter("uuid"));
        assert_eq!(r.error.unwrap().code, INVALID_PARAMS);
    }
}
