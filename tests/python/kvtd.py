"""Start and stop real kvtierd processes from Python tests.

Design: the Python twin of tests/lib/daemon.c. Each Daemon gets a private
temporary directory (socket, state, log) and its own pool file under
/dev/shm; start() waits until the socket answers a STATUS through
kvtierctl; the process is killed with the test (PR_SET_PDEATHSIG through
a preexec hook), so a failed test leaves no daemon behind. Paths of the
binaries come from $KVTIERD / $KVTIERCTL, else the build tree.
"""
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("KVTIER_BUILD", os.path.join(ROOT, "build"))
KVTIERD = os.environ.get("KVTIERD", os.path.join(BUILD, "bin", "kvtierd"))
KVTIERCTL = os.environ.get("KVTIERCTL", os.path.join(BUILD, "bin", "kvtierctl"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))


def _die_with_parent():
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Daemon:
    def __init__(self, pool="64M", args=(), keep_dir=None):
        self.dir = keep_dir or tempfile.mkdtemp(prefix="kvt-py-")
        self.sock = os.path.join(self.dir, "kvtierd.sock")
        self.url = "ipc://" + self.sock
        self.pool = "/dev/shm/kvt-py-%s.pool" % os.path.basename(self.dir)
        self.log = os.path.join(self.dir, "kvtierd.log")
        self.pool_bytes, self.args = pool, list(args)
        self.proc = None

    def start(self, extra=(), wait=True):
        argv = [KVTIERD, "--socket", self.url, "--state-dir", self.dir,
                "--pool-path", self.pool, "--pool-bytes", self.pool_bytes,
                "--metrics.listen", "127.0.0.1:0"] + self.args + list(extra)
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen(argv, stdout=logf, stderr=logf,
                                     preexec_fn=_die_with_parent)
        logf.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=20):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError("kvtierd exited %s:\n%s" % (self.proc.returncode, self.logtext()))
            r = subprocess.run([KVTIERCTL, "--socket", self.url, "status"],
                               capture_output=True)
            if r.returncode == 0:
                return
            time.sleep(0.05)
        raise RuntimeError("kvtierd did not answer:\n" + self.logtext())

    def ctl(self, *args, check=True):
        r = subprocess.run([KVTIERCTL, "--socket", self.url] + list(args),
                           capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError("kvtierctl %s: %s" % (" ".join(args), r.stderr))
        return r

    def logtext(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def cleanup(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
        try:
            os.unlink(self.pool)
        except OSError:
            pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()


class Results:
    """Counts checks and prints the closing line the suite runner reads."""

    def __init__(self):
        self.passed = self.failed = 0

    def run(self, fn, *a):
        name = fn.__name__
        try:
            fn(*a)
        except Exception:
            import traceback
            self.failed += 1
            print("FAIL", name)
            traceback.print_exc()
        else:
            self.passed += 1
            print("ok  ", name)
        sys.stdout.flush()

    def finish(self):
        print("%d passed, %d failed" % (self.passed, self.failed))
        sys.exit(1 if self.failed or not self.passed else 0)
