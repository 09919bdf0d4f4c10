//! The SQLSTATEs the proxy raises or reacts to, by PostgreSQL's names (`errcodes.txt`), so code
//! says which condition it means instead of five characters. lsngate's own codes for causal
//! reads (`LG001`, `LG002`) are the causal layer's.

/// 01000 `warning`.
pub const WARNING: &str = "01000";
/// 08000 `connection_exception`.
pub const CONNECTION_EXCEPTION: &str = "08000";
/// 08001 `sqlclient_unable_to_establish_sqlconnection`: no server connection could be had for a
/// flight, so nothing of it was sent — unlike 08006, its outcome is known (it had no effect).
pub const UNABLE_TO_ESTABLISH_CONNECTION: &str = "08001";
/// 08006 `connection_failure`: the server connection was lost mid-flight.
pub const CONNECTION_FAILURE: &str = "08006";
/// 08P01 `protocol_violation`.
pub const PROTOCOL_VIOLATION: &str = "08P01";
/// 0A000 `feature_not_supported`.
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
/// 22023 `invalid_parameter_value`.
pub const INVALID_PARAMETER_VALUE: &str = "22023";
/// 25006 `read_only_sql_transaction`: a write reached a replica.
pub const READ_ONLY_SQL_TRANSACTION: &str = "25006";
/// 25P02 `in_failed_sql_transaction`: the block is aborted until its end.
pub const IN_FAILED_SQL_TRANSACTION: &str = "25P02";
/// 26000 `invalid_sql_statement_name`: no such prepared statement.
pub const INVALID_SQL_STATEMENT_NAME: &str = "26000";
/// 28000 `invalid_authorization_specification`.
pub const INVALID_AUTHORIZATION_SPECIFICATION: &str = "28000";
/// 28P01 `invalid_password`.
pub const INVALID_PASSWORD: &str = "28P01";
/// 3D000 `invalid_catalog_name`: no such database.
pub const INVALID_CATALOG_NAME: &str = "3D000";
/// 42501 `insufficient_privilege`.
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
/// 42P05 `duplicate_prepared_statement`.
pub const DUPLICATE_PREPARED_STATEMENT: &str = "42P05";
/// 42601 `syntax_error`.
pub const SYNTAX_ERROR: &str = "42601";
/// 42704 `undefined_object`.
pub const UNDEFINED_OBJECT: &str = "42704";
/// 53300 `too_many_connections`.
pub const TOO_MANY_CONNECTIONS: &str = "53300";
/// 55000 `object_not_in_prerequisite_state`.
pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
/// 55P02 `cant_change_runtime_param`.
pub const CANT_CHANGE_RUNTIME_PARAM: &str = "55P02";
/// 57014 `query_canceled`.
pub const QUERY_CANCELED: &str = "57014";
/// 57P01 `admin_shutdown`.
pub const ADMIN_SHUTDOWN: &str = "57P01";
/// idle_in_transaction_session_timeout: a client idle inside a transaction block too long.
pub const IDLE_IN_TRANSACTION_SESSION_TIMEOUT: &str = "25P03";
/// idle_session_timeout: a client idle outside a transaction block too long.
pub const IDLE_SESSION_TIMEOUT: &str = "57P05";
