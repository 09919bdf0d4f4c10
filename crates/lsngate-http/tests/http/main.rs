//! The one integration-test binary of lsngate-http: the layer in a real axum router, the Redis
//! token store against a real `redis-server`, and the demo app end to end in headless Chromium
//! over a real PostgreSQL cluster.

mod browser;
#[allow(dead_code)]
#[path = "../../examples/demo/app/mod.rs"]
mod demo_app;
mod layer;
mod redis_store;
mod scopes;
mod support;
mod worker;
