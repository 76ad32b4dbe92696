//! The EC2 adapter against a real EC2 API server: `moto_server` (PyPI `moto[server]`,
//! which `scripts/prereqs.sh test` installs) on 127.0.0.1, with dummy credentials and
//! an endpoint override. Catalog prices come from the policy's table and GPU facts from
//! DescribeInstanceTypes; a launch carries Axle's tags, its ClientToken and user-data;
//! listing by tag finds Axle's instances and nothing else; terminate is idempotent.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axle_burst::aws::{Aws, AwsConfig, AwsPrice};
use axle_burst::credentials::Secret;
use axle_burst::{InstanceState, LaunchSpec, Provider, TAG_BURST_ID, TAG_MANAGED_BY};
use axle_policy::Usd;

/// `moto_server` on a free loopback port, killed when dropped.
struct Moto {
    child: Child,
    url: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn moto() -> Moto {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("moto_server (pip install 'moto[server]'; scripts/prereqs.sh test installs it)");
    let m = Moto {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("moto_server did not start on port {port}");
}

fn config(url: &str) -> AwsConfig {
    AwsConfig {
        regions: vec!["us-east-1".into()],
        prices: BTreeMap::from([
            (
                "p4d.24xlarge".to_string(),
                AwsPrice {
                    on_demand: Usd::parse("32.7726").unwrap(),
                    spot: Some(Usd::parse("9.83").unwrap()),
                },
            ),
            (
                "p5.48xlarge".to_string(),
                AwsPrice {
                    on_demand: Usd::parse("98.32").unwrap(),
                    spot: None,
                },
            ),
        ]),
        image_ids: BTreeMap::from([("us-east-1".to_string(), "ami-axle-spoke".to_string())]),
        endpoint: Some(url.to_string()),
        credentials: Some((Secret::new("AKIDEXAMPLE"), Secret::new("dummy-secret"))),
    }
}

fn spec(key: &str, spot: bool) -> LaunchSpec {
    LaunchSpec {
        idempotency_key: key.to_string(),
        instance_type: "p4d.24xlarge".into(),
        region: "us-east-1".into(),
        spot,
        tags: BTreeMap::from([
            (TAG_MANAGED_BY.to_string(), "axle".to_string()),
            (TAG_BURST_ID.to_string(), key.to_string()),
        ]),
        user_data: "#!/bin/sh\naxle-spoke --join-token axlej_example\n".into(),
        image: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_offers_launches_lists_and_terminates_against_moto() {
    let m = moto().await;
    let aws = Aws::new(config(&m.url)).await.unwrap();

    let offers = aws.catalog().await.unwrap();
    let p4d: Vec<_> = offers
        .iter()
        .filter(|o| o.instance_type == "p4d.24xlarge")
        .collect();
    assert_eq!(p4d.len(), 2, "on-demand and spot: {offers:?}");
    let od = p4d.iter().find(|o| !o.spot).unwrap();
    assert_eq!(od.price_per_hour, Usd::from_micros(32_772_600));
    assert_eq!((od.gpu_model.as_str(), od.gpus), ("A100", 8));
    assert_eq!(od.gpu_memory_mb, 40_960);
    let p5 = offers
        .iter()
        .find(|o| o.instance_type == "p5.48xlarge")
        .unwrap();
    assert_eq!(
        (p5.gpu_model.as_str(), p5.gpus, p5.spot),
        ("H100", 8, false)
    );

    let launched = aws.launch(&spec("burst-1", false)).await.unwrap();
    assert!(launched.id.starts_with("i-"), "{launched:?}");
    assert!(launched.is_axles());
    let spot = aws.launch(&spec("burst-2", true)).await.unwrap();

    // An instance someone else launched, without Axle's tags.
    let raw = aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::config::Builder::new()
            .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
            .region(aws_sdk_ec2::config::Region::new("us-east-1"))
            .endpoint_url(&m.url)
            .credentials_provider(aws_sdk_ec2::config::Credentials::new(
                "AKIDEXAMPLE",
                "dummy-secret",
                None,
                None,
                "test",
            ))
            .http_client(
                aws_smithy_http_client::Builder::new()
                    .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                        aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                    ))
                    .build_https(),
            )
            .build(),
    );
    raw.run_instances()
        .image_id("ami-other")
        .instance_type(aws_sdk_ec2::types::InstanceType::from("t3.micro"))
        .min_count(1)
        .max_count(1)
        .send()
        .await
        .unwrap();

    let mine = aws.list(TAG_MANAGED_BY, "axle").await.unwrap();
    let mut ids: Vec<&str> = mine.iter().map(|i| i.id.as_str()).collect();
    ids.sort();
    let mut want = vec![launched.id.as_str(), spot.id.as_str()];
    want.sort();
    assert_eq!(ids, want, "only Axle's instances");
    let one = aws.list(TAG_BURST_ID, "burst-1").await.unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].name, "burst-1");
    assert_eq!(one[0].instance_type, "p4d.24xlarge");

    let d = aws.describe(&launched.id).await.unwrap().unwrap();
    assert!(
        matches!(d.state, InstanceState::Pending | InstanceState::Running),
        "{d:?}"
    );
    assert_eq!(aws.describe("i-0123456789abcdef0").await.unwrap(), None);

    aws.terminate(&launched.id).await.unwrap();
    let d = aws.describe(&launched.id).await.unwrap().unwrap();
    assert!(
        matches!(d.state, InstanceState::Terminated | InstanceState::Stopping),
        "{d:?}"
    );
    // Again, and for an id EC2 never had: both fine.
    aws.terminate(&launched.id).await.unwrap();
    aws.terminate("i-0123456789abcdef0").await.unwrap();

    // A region it does not serve is a permanent error, not a panic.
    let mut elsewhere = spec("burst-3", false);
    elsewhere.region = "eu-west-1".into();
    assert!(!aws.launch(&elsewhere).await.unwrap_err().is_retryable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_is_a_retryable_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let aws = Aws::new(config(&format!("http://127.0.0.1:{port}")))
        .await
        .unwrap();
    let e = aws.catalog().await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(!e.to_string().contains("dummy-secret"), "{e}");
}
