"""The HTTP API's parts, by job: the request as the routes read it (``request``), what they answer
(``views``), ``Idempotency-Key`` (``idempotency``), the waits of a held request (``waits``), and one route
module per Lambda function (``sessions``, ``run``, ``tools``, ``commit``), each a Powertools ``Router``.

``serving.api`` puts them together into a function's handler.
"""
