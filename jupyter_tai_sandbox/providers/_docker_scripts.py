"""The small ``sh`` scripts the docker provider runs inside a session container.

They use only what the session image contract names: ``sh``, ``setsid``,
``rm``, ``kill``, ``readlink``, ``ls``, a fractional ``sleep`` and ``/proc``,
with state files in ``/tmp`` (``/tmp/.tai-sbx-<token>.*``). A one-shot's
wrapper spawns as little as it can (each spawn in a container costs about a
millisecond): no ``mv`` or ``cat`` for state files, and no ``ls`` or
``readlink`` where the shell's ``test`` has ``-ef``.

RUN -- the exec's own process (argv: HOLD, token, cwd, command...). It runs
HOLD in a new session (so HOLD leads a fresh process group, outside RUN's),
waits for it, and exits with the command's own status when HOLD recorded one --
so a kill after the command's exit still reports the command's status -- else
with HOLD's (137 when the group was killed first). When a KILL is under way
(``.k`` names its pid) RUN waits for that KILL to exit first (at most 1 s): the
engine handles one container's exec exits one at a time and waits up to 2 s on
an exec whose output is still held, so a KILL whose exit queued behind RUN's
would seem to take 2 s, and the held output would be closed by the engine
before the provider could see it held.

HOLD -- leads the command's process group and stays in it: it records its pid
(= the group id) for KILL, runs the command in the foreground (so the command
keeps stdin and default signal dispositions, unlike a background job of a
non-interactive shell) through a ``sh -c`` that records its own pid (``.c``,
the command's pid once it execs) -- the command stays HOLD's child even if it
calls ``setsid`` --, records its status, then keeps the group (and so its
id) while any process other than RUN and itself still holds the command's
stdout or stderr (``/proc/*/fd/1`` and ``/fd/2`` compared with its own by the
shell's ``test -ef``, which spawns nothing; by ``readlink`` and ``ls`` in a
shell without ``-ef``), polling with a timed ``read`` on a FIFO it made before the
command started (``.f``; a fractional ``sleep`` where there is none), so the
holding loop forks nothing: a command that exhausts the container's pids (a fork
bomb) cannot make the holder die of a failed fork and let its group go. A trapped INT/QUIT
keeps it alive should a command signal its own group. State files are written
in place and read with the shell's ``read``: a reader that finds one empty
(still being written) looks again.

The command's stderr travels as fd 3 and becomes its fd 2 only in a shell
that execs the command: RUN and HOLD keep their own stderr on /dev/null, so
the "Killed" line a shell prints for a foreground child stopped by a signal
never lands in the command's stderr.

KILL -- (argv: token) records its own pid in ``.k``, SIGKILLs the command's own
process (``.c``) when it is still HOLD's child -- so a command that left the
group by ``setsid`` is stopped too, and a pid since reused is not --, then
kills the recorded group with SIGKILL, waiting briefly for HOLD to record it. A group already gone
is nothing to stop; any other failure prints the kill's error line and exits 1.

RUN_PTY -- the exec's own process for a command on a terminal (argv: token,
cwd, rows, cols, command...). The engine starts a tty exec as the leader of a
new session with the terminal as its controlling tty and its group in the
foreground, so RUN_PTY stays in place: it records its pid (= the session id),
sets the window size when the image has ``stty``, and runs the command in the
foreground group (through a ``sh -c`` that records the command's pid in
``.c``, as HOLD does), so ^C (and a resize's SIGWINCH) reaches it; an interactive
shell then moves jobs to groups of its own, all within the session. INT, QUIT,
TSTP and HUP are trapped so the holder outlives a ^C. After the command's exit
it lets go of the terminal and holds the session while any other process
still holds the terminal (as for HOLD's output), until KILL_PTY marks a stop
(``.k``), waits for that KILL_PTY to exit (as RUN does), then exits with the
command's own status.

KILL_PTY -- (argv: token) marks the stop, then SIGKILLs every process of the
recorded session but its holder (read from ``/proc/*/stat``), pass after pass
until none is left, so a job forked meanwhile goes too, and the command's own
process (``.c``, as for KILL) even if it left the session; any other process
that left the session (setsid) is not stopped. A member that cannot be killed prints the
kill's error line and exits 1.
"""

#: Waits (at most 1 s) for a KILL under way -- its pid in ``$t.k`` -- to have exited.
_AWAIT_KILL = r"""if [ -f "$t.k" ]; then
  i=0 k=
  while [ $i -lt 100 ]; do
    [ -n "$k" ] || { read -r k <"$t.k"; } 2>/dev/null
    [ -n "$k" ] && [ ! -d /proc/"$k" ] && break
    i=$((i + 1))
    sleep 0.01
  done
fi
"""

RUN = r"""h=$1 t=/tmp/.tai-sbx-$2 d=$3
shift 3
exec 3>&2 2>/dev/null
setsid sh -c "$h" sh "$t" "$d" "$@"
r=$?
{ read -r s <"$t.s"; } 2>/dev/null && r=$s
""" + _AWAIT_KILL + r"""rm -f "$t.p" "$t.s" "$t.k" "$t.c" "$t.f"
exit $r
"""

HOLD = r"""t=$1
echo $$ >"$t.p"
cd "$2" 2>&3 || exit
shift 2
trap : INT QUIT
mkfifo "$t.f" 2>/dev/null
sh -c 'echo $$ >"$1.c"; shift; exec "$@" 2>&3 3>&-' sh "$t" "$@"
echo $? >"$t.s"
if [ /proc/$$/fd/1 -ef /proc/$$/fd/1 ] 2>/dev/null; then
  held() {
    for f in /proc/[0-9]*/fd/1 /proc/[0-9]*/fd/2; do
      case $f in /proc/$$/* | /proc/$PPID/*) continue ;; esac
      { [ "$f" -ef /proc/$$/fd/1 ] || [ "$f" -ef /proc/$$/fd/3 ]; } 2>/dev/null && return 0
    done
    return 1
  }
else
  o1=$(readlink /proc/$$/fd/1) o2=$(readlink /proc/$$/fd/3)
  held() {
    ls -l /proc/[0-9]*/fd/1 /proc/[0-9]*/fd/2 2>/dev/null | {
      while read -r l; do
        case "$l" in *" /proc/$$/fd/"* | *" /proc/$PPID/fd/"*) continue ;; esac
        case "$l" in *" -> $o1" | *" -> $o2") exit 0 ;; esac
      done
      exit 1
    }
  } >/dev/null 2>&1 3>&-
fi
if [ -p "$t.f" ] && exec 4<>"$t.f"; then
  while held; do read -t 0.05 _ <&4; done
else
  while held; do sleep 0.05 3>&-; done
fi
"""

#: argv: token. Waits briefly for the wrapper to record its group (exit 0, nothing to stop, if it
#: never does), leaving the group id in $p and the state-file prefix in $t. "Briefly" is 1.5 s of
#: the clock (``/proc/uptime``, read without a spawn), not a count of polls: a wrapper that ended
#: before the stop looked (its state files removed) is the common case, and on a loaded machine 150
#: polls, each spawning a ``sleep``, took many seconds. Without /proc/uptime the count bounds it.
_FIND_GROUP = r"""t=/tmp/.tai-sbx-$1 i=0 e=
until { read -r p <"$t.p"; } 2>/dev/null && [ -n "$p" ]; do
  i=$((i + 1))
  [ $i -gt 150 ] && exit 0
  if { read -r u _ </proc/uptime; } 2>/dev/null; then
    u=$((${u%.*} * 100 + 1${u#*.} - 100))
    [ -n "$e" ] || e=$((u + 150))
    [ $u -gt $e ] && exit 0
  fi
  sleep 0.01
done
"""

#: Reads the command's own pid (``$t.c``) into $c: it stays the wrapper's child even after a setsid.
_OWN = r"""c=
{ read -r c <"$t.c"; } 2>/dev/null
"""

KILL = _FIND_GROUP + r"""echo $$ >"$t.k"
""" + _OWN + r"""if [ -n "$c" ] && { read -r l <"/proc/$c/stat"; } 2>/dev/null; then
  set -- ${l##*) }
  [ "$2" = "$p" ] && [ "$1" != Z ] && kill -9 "$c" 2>/dev/null
fi
kill -9 -"$p" 2>/dev/null && exit 0
rm -f "$t.k"
[ -d /proc/"$p" ] || exit 0
kill -9 -"$p"
exit 1
"""

RUN_PTY = r"""t=/tmp/.tai-sbx-$1 d=$2
exec 3>&2 2>/dev/null
echo $$ >"$t.p"
cd "$d" 2>&3 || exit
stty rows "$3" cols "$4" 2>/dev/null
shift 4
trap : INT QUIT TSTP HUP
o=$(readlink /proc/$$/fd/0)
sh -c 'echo $$ >"$1.c"; shift; exec "$@"' sh "$t" "$@" 2>&3 3>&-
r=$?
exec 0</dev/null 1>/dev/null 3>&-
held() {
  ls -l /proc/[0-9]*/fd/0 /proc/[0-9]*/fd/1 /proc/[0-9]*/fd/2 2>/dev/null | {
    while read -r l; do
      case "$l" in *" /proc/$$/fd/"*) continue ;; esac
      case "$l" in *" -> $o") exit 0 ;; esac
    done
    exit 1
  }
}
while [ ! -f "$t.k" ] && held; do sleep 0.05; done
""" + _AWAIT_KILL + r"""rm -f "$t.p" "$t.k" "$t.c"
exit $r
"""

KILL_PTY = _FIND_GROUP + r"""echo $$ >"$t.k"
""" + _OWN + r"""i=0
while [ $i -lt 100 ]; do
  i=$((i + 1)) n=0
  for d in /proc/[0-9]*; do
    { read -r l <"$d/stat"; } 2>/dev/null || continue
    set -- ${l##*) }
    [ "$1" != Z ] && [ "${d#/proc/}" != "$p" ] || continue
    [ "$4" = "$p" ] || { [ "${d#/proc/}" = "$c" ] && [ "$2" = "$p" ]; } || continue
    n=$((n + 1))
    kill -9 "${d#/proc/}" 2>/dev/null || [ ! -d "$d" ] || e=$(kill -9 "${d#/proc/}" 2>&1)
  done
  [ $n -eq 0 ] && exit 0
  sleep 0.01
done
echo "${e:-processes of the session survived SIGKILL}" >&2
exit 1
"""

#: argv: a workspace path's components. Walks them in the container, in one command whatever the
#: depth (an engine call per component would let one deep path take the engine's workers): ``cd -P``
#: into each existing folder, checking after each step that the working directory is inside the
#: workspace; a final component that is no folder is followed (a symlink chain, each folder part
#: entered the same way). Prints ``ok KIND INDEX`` NUL ``FOLDER`` NUL ``NAME`` NUL: KIND is ``directory``,
#: ``file`` (any non-folder) or ``missing``; FOLDER the real folder reached; NAME the file's (or the
#: missing target's) name in it when the last component led to no folder; INDEX how many components were
#: entered. Or ``error KIND detail`` NUL.
_WALK = r"""w=/workspace
fail() { printf 'error %s %s\0' "$1" "$2"; exit 0; }
inside() { case $PWD in "$w" | "$w"/*) ;; *) fail outside "$1" ;; esac; }
cd -P -- "$w" 2>/dev/null || fail missing "the workspace"
i=0 k=directory r=
while [ $# -gt 0 ]; do
  if [ -d "$1" ]; then
    cd -P -- "$1" 2>/dev/null || fail cannot "enter $1"
    inside "$1"
  elif [ -e "$1" ] || [ -L "$1" ]; then
    [ $# -eq 1 ] || fail notfolder "$1"
    f=$1 j=0
    while [ -L "$f" ]; do
      j=$((j + 1))
      [ $j -gt 40 ] && fail cannot "follow $1 (too many symlinks)"
      t=$(readlink -- "$f") || fail cannot "read the symlink $f"
      case $t in
        */*) d=${t%/*}; cd -P -- "${d:-/}" 2>/dev/null || fail notfolder "$t"; inside "$1"; f=${t##*/} ;;
        *) f=$t ;;
      esac
    done
    if [ -d "$f" ]; then
      cd -P -- "$f" 2>/dev/null || fail cannot "enter $1"
      inside "$1"
    elif [ -e "$f" ]; then
      k=file r=$f
    else
      k=missing r=$f
    fi
    break
  else
    k=missing
    break
  fi
  i=$((i + 1))
  shift
done
"""

#: argv: the path's components (see ``_WALK``).
RESOLVE = _WALK + r"""printf 'ok %s %s\0%s\0%s\0' "$k" "$i" "$PWD" "$r"
"""

#: argv: the folder's components (see ``_WALK``). Prints ``_WALK``'s answer, then, when it is a
#: folder, ``type/size/mtime/name`` records, NUL-terminated.
LIST = _WALK + r"""printf 'ok %s %s\0%s\0%s\0' "$k" "$i" "$PWD" "$r"
[ $k = directory ] || exit 0
for f in * .[!.]* ..?*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  if [ -L "$f" ]; then k=symlink; elif [ -d "$f" ]; then k=directory; elif [ -f "$f" ]; then k=file; else k=other; fi
  set -f
  set -- $(ls -lnd --full-time "$f" 2>/dev/null)
  printf '%s/%s/%s %s %s/%s\0' "$k" "$5" "$6" "$7" "$8" "$f"
  set +f
done
"""

# ------------------------------------------------------------------ file transfers
#
# Workspace files travel through commands (run under RUN/HOLD, so a stop is the
# usual KILL), never the engine's archive API: an archive holds the container's
# lock until it is fully read or written, so a slow client would block every
# other engine call on that container. Both scripts confine themselves inside
# the container, in the same step as the read or write: what they check is the
# very folder (their own working directory, after ``cd -P``) or open file they
# then use, so a symlink swapped in meanwhile cannot redirect them. The
# workspace is a mount of its own, and a folder cannot be renamed out of a
# mount, so a working directory once inside /workspace stays inside. They run
# as the container's user, with no more rights than the session's own commands.
# Each answers on its first stdout line: ``ok ...`` or ``error KIND message``.

#: The folder walk of PUT: ``cd -P`` into each parent of the target (made when missing), checking
#: after each step that the working directory is inside the workspace; leaves the name in $f.
_CONFINE = r"""w=/workspace
fail() { echo "error $1 $2"; exit 1; }
inside() { case $PWD in "$w" | "$w"/*) ;; *) fail outside "$1" ;; esac; }
cd -P -- "$w" 2>/dev/null || fail missing "the workspace"
"""

#: argv: token, size in bytes, then the path's components (relative to the workspace).
#: Writes stdin to a new temporary file in the target's folder (exclusive create), checks it got
#: ``size`` bytes, then renames it over the target (``mv -T``: a rename within the folder, which
#: never follows a symlink put in the target's place). Missing folders are made on the way.
PUT = _CONFINE + r"""k=$1 n=$2
shift 2
while [ $# -gt 1 ]; do
  if ! cd -P -- "$1" 2>/dev/null; then
    { [ -e "$1" ] || [ -L "$1" ]; } && fail notfolder "$1"
    mkdir -- "$1" 2>/dev/null || [ -d "$1" ] || fail cannot "make the folder $1"
    cd -P -- "$1" 2>/dev/null || fail notfolder "$1"
  fi
  inside "$1"
  shift
done
f=$1 i=0
while [ -L "$f" ]; do
  i=$((i + 1))
  [ $i -gt 40 ] && fail notfile "$1 (too many symlinks)"
  t=$(readlink -- "$f") || fail cannot "read the symlink $f"
  case $t in
    */*) d=${t%/*}; cd -P -- "${d:-/}" 2>/dev/null || fail notfolder "$t"; inside "$1"; f=${t##*/} ;;
    *) f=$t ;;
  esac
done
[ -n "$f" ] && [ ! -d "$f" ] || fail notfile "$1"
{ [ -e "$f" ] && [ ! -f "$f" ]; } && fail notfile "$1"
tmp=.tai-upload-$k
set -C
if ! cat >"$tmp"; then
  rm -f -- "$tmp"
  fail cannot "write $1"
fi
set -- $(ls -ln -- "$tmp" 2>/dev/null)
if [ "$5" != "$n" ]; then
  rm -f -- "$tmp"
  fail short "got ${5:-no} bytes of $n"
fi
e=$(mv -fT -- "$tmp" "$f" 2>&1) || { rm -f -- "$tmp"; fail cannot "rename into place: $e"; }
echo ok
"""

#: argv: the file's workspace-relative path. Opens it, then checks the *open file* (its real path in
#: /proc and its type), prints ``ok SIZE`` and the content; once the content is out it tells stderr
#: ``end`` and waits for its stdin to end, so it exits only after the provider has every byte (the
#: engine would close the output of an exited command about 2 s later, pending bytes or not).
GET = r"""w=/workspace
fail() { echo "error $1 $2"; exit 1; }
p=$w/$1
[ -e "$p" ] || fail missing "$1"
[ -f "$p" ] || fail notfile "$1"
exec 4<"$p" || fail cannot "open $1"
r=$(readlink /proc/$$/fd/4)
case $r in "$w"/*) ;; *) fail outside "$1" ;; esac
[ -f /proc/$$/fd/4 ] || fail notfile "$1"
set -- $(ls -lnL /proc/$$/fd/4)
echo "ok $5"
cat <&4 || exit 1
exec 4<&-
echo end >&2
read -r _ || :
"""
