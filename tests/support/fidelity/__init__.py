"""The deployment-fidelity harness: the synthesized stack run as AWS would run it, on this machine.

* ``template``: the CloudFormation template read back, every reference resolved to a concrete fake value.
* ``iam``: each AWS call mapped to the IAM actions and resources AWS authorizes it by, checked against a
  function's policy statements.
* ``lambda_``: one worker process per function (a warm sandbox) with exactly its template environment, its
  timeout and its ``MemorySize`` (a sandbox past it is killed: ``Runtime.OutOfMemory``; each function's peak
  in ``peaks``); a sandbox can be killed before a call (``crash_before``), paused after one (``hold_after``),
  or refused one (``fail_next``), and a function resized (``resize``).
* ``worker``: the bootstrap that runs inside such a process (the IAM check wraps botocore there, and the
  memory size is looked at: ``_Memory``).
* ``capture``: while turned on (``LambdaService.capture``), what each DynamoDB call touched, for ``bench cost``.
* ``stepfunctions``: an ASL interpreter served over HTTP, which the functions reach with their own botocore.
* ``deployment``: API Gateway's routing and limits, and the ``Deployment`` the tests drive.

* ``calls``: what the tests do through a deployment's API (create, run, answer, the ledger).
* ``secret_store``: moto's Secrets Manager and SSM Parameter Store served over HTTP.

Stand-ins for AWS endpoints: ``AWS_ENDPOINT_URL_DYNAMODB`` (DynamoDB Local) and ``AWS_ENDPOINT_URL_SFN``
(the interpreter), and where a test adds them ``AWS_ENDPOINT_URL_SECRETS_MANAGER``/``AWS_ENDPOINT_URL_SSM``
(``secret_store``) and ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME`` (a loopback model server), are the only variables a
function sees that AWS would not set.
"""
