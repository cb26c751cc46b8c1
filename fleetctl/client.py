"""Where fleet is and who is asking (environment or config file), and the HTTP calls."""

from __future__ import annotations

import configparser
import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TIMEOUT_S = 30.0


class CliError(Exception):
    """Ends the command with `exit_code` and `message` on stderr."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Refused(CliError):
    """The API refused the request (its sentence is the message): exit 1."""

    exit_code = 1

    def __init__(self, message: str, status: int, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class Unreachable(CliError):
    """No answer from the server, or the token was not accepted: exit 3."""

    exit_code = 3


def config_path() -> Path:
    explicit = os.environ.get("FLEET_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "fleet" / "config"


def read_config(path: Path | None = None) -> dict[str, str]:
    path = path or config_path()
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except configparser.Error as exc:
        raise CliError(f"Cannot read {path}: {exc}; run `fleetctl login` again.")
    return dict(parser["fleet"]) if parser.has_section("fleet") else {}


def write_config(*, url: str, token: str, path: Path | None = None) -> Path:
    """Write the URL and token readable by the user only (0600), replacing the file whole."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    parser = configparser.ConfigParser(interpolation=None)
    parser["fleet"] = {"url": url, "token": token}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config-")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            parser.write(out)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if url.endswith("/api/v1"):
        url = url[: -len("/api/v1")]
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(f"{url!r} is not a fleet address; give one like https://fleet.example.org")
    return url


@dataclass
class Client:
    url: str
    token: str

    @classmethod
    def from_environment(cls) -> Client:
        config = read_config()
        url = os.environ.get("FLEET_URL") or config.get("url")
        token = os.environ.get("FLEET_TOKEN") or config.get("token")
        if not url or not token:
            raise Unreachable(
                "fleetctl does not know where fleet is or who you are: run "
                "`fleetctl login --url URL`, or set FLEET_URL and FLEET_TOKEN."
            )
        return cls(url=normalize_url(url), token=token)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
        raw: bool = False,
    ) -> Any:
        """Call /api/v1/<path> and return the decoded JSON (the text when `raw`)."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        url = f"{self.url}/api/v1/{path.lstrip('/')}"
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Token {self.token}")
        req.add_header("Accept", "application/json" if not raw else "*/*")
        req.add_header("User-Agent", "fleetctl")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as response:
                text = response.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            raise _refusal(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"Cannot reach fleet at {self.url}: {reason}.") from None
        if raw:
            return text
        try:
            return json.loads(text) if text else None
        except ValueError:
            raise Unreachable(f"{self.url} answered with something that is not fleet's API.")


def _refusal(exc: urllib.error.HTTPError) -> CliError:
    text = exc.read().decode("utf-8", errors="replace")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    message = body.get("message") if isinstance(body, dict) else None
    if exc.code == 401:
        return Unreachable(
            f"fleet did not accept the token: {message or 'unauthorized'} "
            "(run `fleetctl login` or set FLEET_TOKEN)."
        )
    if exc.code in (502, 503, 504):
        return Unreachable(f"fleet is not answering (HTTP {exc.code}); try again shortly.")
    if not message:
        message = f"HTTP {exc.code} from fleet" + (f": {text.strip()[:200]}" if text else "")
    return Refused(message, exc.code, body)
