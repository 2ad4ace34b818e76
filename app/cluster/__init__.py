"""vramgate as a Ray Serve application (`vramgate cluster serve`; `pip install
vramgate[cluster]`).

One `Replica` deployment runs the whole single-machine server (its own gate, queue and
learned prices) in each replica, one per GPU; an `Ingress` deployment takes the HTTP
requests, sends each to the replica with the most free bytes for it (`FreeBytesRouter`, a
Ray Serve request router fed by the replicas' own figures), retries a replica's refusal
(queue full, too big for its device) or death on another before the caller sees it, and
streams the answer back. Nothing here is imported by the server itself: only this
package imports ray.
"""
