"""The local Cloud Storage server's buckets as files, as Cloud Storage FUSE shows them on Vertex AI.

    python -m scripts.rehearsal.gcs_fuse --api http://127.0.0.1:PORT MOUNTPOINT

On Vertex AI every bucket is readable and writable under /gcs/BUCKET/. `storage.py`
mounts this on the host and binds it into every replica at /gcs, so a file written under
/gcs/BUCKET/x is the object gs://BUCKET/x and the other way round, from any replica, while the
job runs.

It behaves as Cloud Storage FUSE does with implicit directories: a directory is a `NAME/` object
or any object under `NAME/`; mkdir writes the `NAME/` object; a file's content is uploaded whole
when it is closed (or flushed); a rename is a copy and a delete, one object at a time. Permissions
and times are not kept. It talks to fake-gcs-server's JSON API directly (no TLS, no proxy): it runs
on the host, beside the server.

Runs in the foreground until `fusermount3 -u MOUNTPOINT` (or SIGTERM); needs libfuse3 (Debian's
fuse3) and mfusepy. The images run as uid 1000, and a FUSE mount admits only the user who mounted
it unless it is mounted with allow_other, which root may always ask for and anyone else only where
/etc/fuse.conf says `user_allow_other` (fuse(8)); so it is asked for whenever it is allowed.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import mfusepy

from trainer import cli

DIRECTORY = {"st_mode": stat.S_IFDIR | 0o777, "st_nlink": 2}


class Buckets(mfusepy.Operations):
    """Paths are /BUCKET/OBJECT; every call is one or a few requests to the JSON API."""

    def __init__(self, api: str):
        self.api = api.rstrip("/")
        self.mutex = threading.Lock()
        self.handles: dict[int, dict] = {}  # fh -> {"bucket", "key", "data", "dirty"}
        self.next_handle = 1

    # the JSON API

    def request(self, method: str, path: str, query: dict | None = None, body: bytes | None = None,
                content_type: str = "application/json"):
        url = f"{self.api}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        request = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            if error.code == 404:
                raise mfusepy.FuseOSError(errno.ENOENT) from None
            raise mfusepy.FuseOSError(errno.EIO) from None
        except OSError:
            raise mfusepy.FuseOSError(errno.EIO) from None

    @staticmethod
    def quote(key: str) -> str:
        return urllib.parse.quote(key, safe="")

    def metadata(self, bucket: str, key: str) -> dict | None:
        try:
            return json.loads(self.request("GET", f"/storage/v1/b/{bucket}/o/{self.quote(key)}"))
        except mfusepy.FuseOSError as error:
            if error.errno == errno.ENOENT:
                return None
            raise

    def listing(self, bucket: str, prefix: str, limit: int | None = None) -> tuple[list[str], list[str]]:
        """(object names, sub-prefixes) directly under `prefix`."""
        names, prefixes, token = [], [], None
        while True:
            query = {"prefix": prefix, "delimiter": "/", **({"maxResults": limit} if limit else {}),
                     **({"pageToken": token} if token else {})}
            page = json.loads(self.request("GET", f"/storage/v1/b/{bucket}/o", query))
            names += [item["name"] for item in page.get("items", [])]
            prefixes += page.get("prefixes", [])
            token = page.get("nextPageToken")
            if not token or limit:
                return names, prefixes

    def everything_under(self, bucket: str, prefix: str) -> list[str]:
        names, token = [], None
        while True:
            query = {"prefix": prefix, **({"pageToken": token} if token else {})}
            page = json.loads(self.request("GET", f"/storage/v1/b/{bucket}/o", query))
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken")
            if not token:
                return names

    def download(self, bucket: str, key: str) -> bytes:
        return self.request("GET", f"/storage/v1/b/{bucket}/o/{self.quote(key)}", {"alt": "media"})

    def upload(self, bucket: str, key: str, data: bytes) -> None:
        self.request("POST", f"/upload/storage/v1/b/{bucket}/o", {"uploadType": "media", "name": key}, bytes(data),
                     "application/octet-stream")

    def delete(self, bucket: str, key: str) -> None:
        self.request("DELETE", f"/storage/v1/b/{bucket}/o/{self.quote(key)}")

    # paths

    @staticmethod
    def split(path: str) -> tuple[str, str]:
        bucket, _, key = path.lstrip("/").partition("/")
        return bucket, key

    def is_directory(self, bucket: str, key: str) -> bool:
        names, prefixes = self.listing(bucket, key.rstrip("/") + "/", limit=1)
        return bool(names or prefixes)

    def buckets(self) -> list[str]:
        return [item["name"] for item in json.loads(self.request("GET", "/storage/v1/b")).get("items", [])]

    # FUSE operations

    def getattr(self, path, fh=None):
        bucket, key = self.split(path)
        if not bucket:
            return dict(DIRECTORY)
        if not key:
            if bucket in self.buckets():
                return dict(DIRECTORY)
            raise mfusepy.FuseOSError(errno.ENOENT)
        with self.mutex:
            open_copy = next((h for h in self.handles.values() if (h["bucket"], h["key"]) == (bucket, key)), None)
            if open_copy is not None:
                return {"st_mode": stat.S_IFREG | 0o666, "st_nlink": 1, "st_size": len(open_copy["data"]),
                        "st_mtime": time.time()}
        found = self.metadata(bucket, key)
        if found is not None:
            updated = found.get("updated", "")
            try:
                mtime = time.mktime(time.strptime(updated[:19], "%Y-%m-%dT%H:%M:%S")) if updated else time.time()
            except ValueError:
                mtime = time.time()
            return {"st_mode": stat.S_IFREG | 0o666, "st_nlink": 1, "st_size": int(found.get("size", 0)),
                    "st_mtime": mtime, "st_ctime": mtime, "st_atime": mtime}
        if self.is_directory(bucket, key):
            return dict(DIRECTORY)
        raise mfusepy.FuseOSError(errno.ENOENT)

    def readdir(self, path, fh):
        bucket, key = self.split(path)
        if not bucket:
            return [".", "..", *self.buckets()]
        prefix = key.rstrip("/") + "/" if key else ""
        names, prefixes = self.listing(bucket, prefix)
        entries = {name[len(prefix):] for name in names if name != prefix}
        entries |= {p[len(prefix):].rstrip("/") for p in prefixes}
        return [".", "..", *sorted(e for e in entries if e)]

    def mkdir(self, path, mode):
        bucket, key = self.split(path)
        if not key:
            raise mfusepy.FuseOSError(errno.EPERM)  # buckets are made with the server, not here
        self.upload(bucket, key.rstrip("/") + "/", b"")
        return 0

    def rmdir(self, path):
        bucket, key = self.split(path)
        prefix = key.rstrip("/") + "/"
        if [name for name in self.everything_under(bucket, prefix) if name != prefix]:
            raise mfusepy.FuseOSError(errno.ENOTEMPTY)
        try:
            self.delete(bucket, prefix)
        except mfusepy.FuseOSError as error:
            if error.errno != errno.ENOENT:
                raise
        return 0

    def unlink(self, path):
        self.delete(*self.split(path))
        return 0

    def rename(self, old, new):
        (bucket, key), (new_bucket, new_key) = self.split(old), self.split(new)
        if self.metadata(bucket, key) is not None:
            moves = [(key, new_key)]
        else:
            prefix = key.rstrip("/") + "/"
            moves = [(name, new_key.rstrip("/") + "/" + name[len(prefix):]) for name in self.everything_under(bucket, prefix)]
            if not moves:
                raise mfusepy.FuseOSError(errno.ENOENT)
        for source, target in moves:  # Cloud Storage has no rename: copy, then delete
            self.upload(new_bucket, target, self.download(bucket, source))
            self.delete(bucket, source)
        return 0

    def _handle(self, bucket: str, key: str, data: bytes, dirty: bool) -> int:
        with self.mutex:
            fh = self.next_handle
            self.next_handle += 1
            self.handles[fh] = {"bucket": bucket, "key": key, "data": bytearray(data), "dirty": dirty}
            return fh

    def create(self, path, mode, fi=None):
        bucket, key = self.split(path)
        fh = self._handle(bucket, key, b"", True)
        self.flush(path, fh)  # the object exists from now, as on Cloud Storage FUSE
        return fh

    def open(self, path, flags):
        bucket, key = self.split(path)
        truncate = flags & 0o1000  # O_TRUNC
        data = b"" if truncate else self.download(bucket, key)
        return self._handle(bucket, key, data, bool(truncate))

    def read(self, path, size, offset, fh):
        with self.mutex:
            return bytes(self.handles[fh]["data"][offset:offset + size])

    def write(self, path, data, offset, fh):
        with self.mutex:
            handle = self.handles[fh]
            buffer = handle["data"]
            if offset > len(buffer):
                buffer.extend(b"\0" * (offset - len(buffer)))
            buffer[offset:offset + len(data)] = data
            handle["dirty"] = True
        return len(data)

    def truncate(self, path, length, fh=None):
        if fh is not None and fh in self.handles:
            with self.mutex:
                handle = self.handles[fh]
                del handle["data"][length:]
                handle["data"].extend(b"\0" * (length - len(handle["data"])))
                handle["dirty"] = True
            return 0
        bucket, key = self.split(path)
        data = bytearray(self.download(bucket, key))[:length]
        self.upload(bucket, key, bytes(data) + b"\0" * (length - len(data)))
        return 0

    def flush(self, path, fh):
        with self.mutex:
            handle = self.handles.get(fh)
            if handle is None or not handle["dirty"]:
                return 0
            bucket, key, data = handle["bucket"], handle["key"], bytes(handle["data"])
            handle["dirty"] = False
        self.upload(bucket, key, data)
        return 0

    def fsync(self, path, datasync, fh):
        return self.flush(path, fh)

    def release(self, path, fh):
        self.flush(path, fh)
        with self.mutex:
            self.handles.pop(fh, None)
        return 0

    def chmod(self, path, mode):
        return 0

    def chown(self, path, uid, gid):
        return 0

    def utimens(self, path, times=None):
        return 0

    def statfs(self, path):
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 24, "f_bfree": 1 << 24, "f_bavail": 1 << 24,
                "f_files": 1 << 20, "f_ffree": 1 << 20, "f_namemax": 1024}


def others_may_enter(fuse_conf: str = "/etc/fuse.conf") -> bool:
    """Whether this process may mount with allow_other: as root, or where fuse.conf allows users to."""
    if os.geteuid() == 0:
        return True
    try:
        with open(fuse_conf) as conf:
            return any(line.split("#", 1)[0].strip() == "user_allow_other" for line in conf)
    except OSError:
        return False


def main(argv=None) -> int:
    parser = cli.OneLineParser(prog="python -m scripts.rehearsal.gcs_fuse", description=__doc__.split("\n")[0])
    parser.add_argument("--api", required=True, help="the server's JSON API, http://127.0.0.1:PORT")
    parser.add_argument("mountpoint")
    args = parser.parse_args(argv)
    mfusepy.FUSE(Buckets(args.api), args.mountpoint, foreground=True, nothreads=False,
                 allow_other=others_may_enter())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
