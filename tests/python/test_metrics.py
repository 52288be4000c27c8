"""/metrics read by the official Prometheus parsers, in both exposition formats."""
import json
import urllib.error
import urllib.request

import openai
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_prometheus


def scrape(router, accept=None):
    headers = {"accept": accept} if accept else {}
    request = urllib.request.Request(f"{router.url}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.headers["content-type"], response.read().decode()


def families(parsed):
    """{family name: (type, {(sample name, sorted labels): value})}"""
    return {
        f.name: (f.type, {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples})
        for f in parsed
    }


def test_metrics_parse_as_prometheus_text_by_default_and_as_openmetrics_when_asked(sim, router):
    engine = sim()
    r = router({"models": [{"id": "m", "engines": [{"id": "A1", "url": engine.url, "role": "plain"}]}]})
    client = openai.OpenAI(base_url=f"{r.url}/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)

    content_type, text = scrape(r)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    prometheus = families(parse_prometheus(text))

    content_type, text = scrape(r, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
    assert content_type == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    openmetrics = families(parse_openmetrics(text))

    requests_type, requests = prometheus["switchyard_requests"]
    assert requests_type == "counter", "the Prometheus parser sees a typed counter family"
    assert requests[("switchyard_requests_total", (("code", "ok"), ("model", "m"), ("outcome", "ok")))] == 1
    assert prometheus["switchyard_engine_in_flight"] == ("gauge", {("switchyard_engine_in_flight", (("engine", "A1"),)): 0})
    assert prometheus["switchyard_engine_healthy"][1][("switchyard_engine_healthy", (("engine", "A1"),))] == 1
    assert prometheus["switchyard_upstream_latency_seconds"][0] == "histogram"
    assert prometheus["switchyard_load_feed_messages"][0] == "counter"
    assert prometheus["switchyard_affinity_bindings"][0] == "gauge"

    # The same families, types and samples in both formats (OpenMetrics may add the
    # _created samples of counters it knows the start of).
    assert set(prometheus) == set(openmetrics)
    for name, (kind, samples) in prometheus.items():
        om_kind, om_samples = openmetrics[name]
        assert om_kind == kind, name
        om_samples = {k: v for k, v in om_samples.items() if not k[0].endswith("_created")}
        assert om_samples == samples, name


def test_names_that_would_forge_metric_lines_are_refused_and_metrics_still_parse(sim, router):
    engine, other = sim(), sim()
    r = router({"models": [{"id": "m", "engines": [{"id": "A1", "url": engine.url, "role": "plain"}]}],
                "admin": {"token": "s3cret"}})
    forged = 'm"} 1\nswitchyard_engine_healthy{engine="A1"} 0\n#'
    body = json.dumps({"id": "B1", "url": other.url, "model": forged}).encode()
    request = urllib.request.Request(f"{r.url}/workers", data=body, method="POST",
                                     headers={"content-type": "application/json", "authorization": "Bearer s3cret"})
    try:
        urllib.request.urlopen(request, timeout=30)
        raise AssertionError("the forged model name was accepted")
    except urllib.error.HTTPError as error:
        assert error.code == 400
        assert json.loads(error.read())["error"] == {
            "message": error_message_of(forged),
            "type": "invalid_request_error",
            "param": "model",
            "code": "invalid_parameter",
        }
    _, text = scrape(r)
    healthy = families(parse_prometheus(text))["switchyard_engine_healthy"][1]
    assert healthy == {("switchyard_engine_healthy", (("engine", "A1"),)): 1}, "no forged sample"


def error_message_of(model):
    """The router's message for a model name with the first character it refuses."""
    refused = next(c for c in model if not ("!" <= c <= "~") or c in '"\\{},=')
    return f"model may hold only visible ASCII characters other than \" \\ {{ }} , =, not {refused!r}"
