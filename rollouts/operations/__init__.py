"""Operating gymweb: the load balancer's probes (``probes``) and Prometheus metrics (``metrics``)."""
