# Pieces of an Envoy bootstrap (YAML) shared by scripts/bench.sh and
# bench/experiments/envoy-hostcalls.sh: a listener on 127.0.0.1 in front of
# the cluster `upstream`, and that cluster. Sourced; defines functions only.

# envoy_listener NAME PORT HTTP_FILTERS_YAML [EXTRA_ROUTES_YAML [CATCH_ALL_YAML]]
# One listener named NAME on 127.0.0.1:PORT: the given HTTP filters, then the
# router, every path to `upstream`. EXTRA_ROUTES_YAML (flow-style route
# entries, each followed by ", ") goes before the catch-all route;
# CATCH_ALL_YAML (flow-style fields) is added to the catch-all route itself.
envoy_listener() {
    cat <<EOF
  - name: $1
    address: { socket_address: { address: 127.0.0.1, port_value: $2 } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: $1
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [${4:-}{ match: { prefix: "/" }, route: { cluster: upstream }${5:+, $5} }]
          http_filters:
$3
          - name: envoy.filters.http.router
            typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }
EOF
}

# envoy_upstream_cluster PORT: the `clusters:` section, one static cluster
# `upstream` at 127.0.0.1:PORT.
envoy_upstream_cluster() {
    cat <<EOF
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: upstream
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $1 } } } }] }]
EOF
}
