//! gRPC's health service (`grpc.health.v1.Health`) beside the picker, without its
//! token, as Envoy's `grpc_health_check` and Kubernetes' gRPC probes ask it: `Check`
//! answers `SERVING` for the server (`""`) and the `ext_proc` service while the
//! picker serves, and `NOT_FOUND` for any other name. `Watch` is `UNIMPLEMENTED`
//! (its callers are told not to retry): it would hold a stream open for every
//! caller, and callers here show no token.

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::SERVICE_NAME;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::Health;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// The picker's health: serving whenever it answers at all.
pub(super) struct PickerHealth;

#[tonic::async_trait]
impl Health for PickerHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = request.get_ref().service.as_str();
        if service.is_empty() || service == SERVICE_NAME {
            Ok(Response::new(HealthCheckResponse {
                status: ServingStatus::Serving.into(),
            }))
        } else {
            Err(Status::not_found(
                "the endpoint picker serves only envoy.service.ext_proc.v3.ExternalProcessor",
            ))
        }
    }

    type WatchStream = futures_util::stream::Empty<Result<HealthCheckResponse, Status>>;

    async fn watch(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented(
            "the endpoint picker's health is checked (Check), not watched",
        ))
    }
}
