"""The providers: where a session runs. Each is a configurable class on the contract
(:mod:`jupyter_tai_sandbox.contract`); ``SandboxApp.provider`` picks one. No module imports one above it.
A provider is a folder whose ``__init__`` hands on its class
(``jupyter_tai_sandbox.providers.docker:DockerSandbox``), with the modules only it uses inside; no
provider's folder imports another's.

Shared by several::

    _common               session ids, deadline and output errors, path confinement, the provider metaclass
    _provider_settings    the deployment scope, cpu and memory limits, session networks' names and range
    _shell_files          remove, move and make folders as shell commands (for a provider without its own)
    _workspaces           whose a persistent workspace is: keys are a namespace per owner (every provider's rule)
    _docker_networks      owner bridges: their subnets, locks and host firewall (docker and vm)
    _docker_agent         the session agent on an engine: its read-only volume, PID 1 (docker and swarm)
    _docker_disk          the disk ceiling: tmpfs workspace and scratch (docker and swarm)
    _docker_session       DockerSession, and how a session's container is found (docker and swarm)
    _docker_sandbox       ContainerSandbox: the base of providers on the Docker Engine API (docker, swarm): its
                          settings, images and limits, spec labels, workspace owners
    container/            the engine-neutral container base: session, commands and files over the agent, and
                          ContainerEngine, the seam an engine adapter fills
    docker_engine/        the Docker Engine API adapter (docker, swarm, vm): DockerEngine (engine), its
                          calls by what they touch (calls, volumes, networks, execs, images), stream,
                          names (labels, prefixes and paths on an engine)

local/ (``local``: host subprocesses, no isolation)::

    sandbox               LocalSandbox
    session               a session: its workspace, exec and file transfer
    command               one command: its group, output, stdin and deadline
    pty                   a command on a terminal
    posix                 process groups, stops, terminals
    paths                 typed path errors
    tenancy               who owns a persistent workspace, and who holds it

docker/ (``docker``: a container per session on a Docker engine)::

    sandbox               DockerSandbox
    containers            a spec's container (limits, disk ceiling, capabilities, workspace) and its start
    ttl                   a session's moved end, as a record volume (labels cannot change)
    forks                 a fork's frozen source, its committed image, and those images' removal
    pool                  the warm pool: its settings, pre-started containers and their session records
    pool_networks         where pooled containers wait, and a claim's move to the owner's network
    images/               the session images built offline (build, packages, dockerfiles/); their names are
                          :mod:`jupyter_tai_sandbox.images`

swarm/ (``swarm``: a one-replica service per session on a Docker Swarm)::

    sandbox               SwarmSandbox
    engine                SwarmEngine: a DockerEngine with TLS exec streams and the manager's API
    session               SwarmSession, the node engines (and their agent volumes), where a task runs
    tasks                 a session's task template, and the watch for it to run on a node
    workspaces            where persistent workspaces live: one record per key on the manager

vm/ (``vm``: a QEMU microVM per session)::

    sandbox               VmSandbox
    machines              the machines on this host: a folder, a QEMU and its agent ports per session
    control               a running machine's QMP control: pause, resume, and the copy a fork makes
    networks              a session's seat on its owner's docker bridge, whose network namespace QEMU joins
    guest/                the guest (build: kernel and initramfs), qemu, probe, snapshot, rootdisk;
                          ``python -m jupyter_tai_sandbox.providers.vm.guest build | probe``

remote/ (``remote``: a session of another server running this extension)::

    sandbox               RemoteSandbox
    exec                  a command over that server's exec websocket
"""
