"""The example tools: orders with the right types, file reading that cannot leave its folder, the mail tool."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandfleet.worker.tools import ToolRegistry
from sandfleet.worker.tools.examples import files, orders, side
from sandfleet.worker.tools.examples._data import DEFAULT_DATA_DIR, data_dir
from sandfleet.worker.tools.examples.scenario import COLUMNS, generate_orders

EXAMPLES = [
    "sandfleet.worker.tools.examples.orders",
    "sandfleet.worker.tools.examples.files",
    "sandfleet.worker.tools.examples.side",
]


def test_the_examples_load_as_a_registry() -> None:
    registry = ToolRegistry.from_modules(EXAMPLES)
    assert registry.names() == ["get_order", "list_products", "load_orders", "list_files", "read_text",
                                "list_sent_emails", "send_email"]  # fmt: skip
    assert [name for name in registry.names() if registry.get(name).side_effects] == ["send_email"]
    described = registry.describe()
    assert "load_orders() -> list[dict]\n    All orders: order_id, date (YYYY-MM-DD), region" in described
    assert "get_order(order_id: str) -> dict\n    One order by its id" in described
    assert "read_text(path: str) -> str\n" in described
    assert "send_email(to: str, subject: str, body: str = '') -> str\n    Send an email" in described


def test_data_dir_comes_from_the_environment(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandfleet.worker.tools.examples._data import data_dir as current

    assert current() == data_dir
    monkeypatch.delenv("SANDFLEET_DATA_DIR")
    assert current() == Path(DEFAULT_DATA_DIR).expanduser()


def test_load_orders_types(orders_dir: Path) -> None:
    rows = orders.load_orders()
    assert len(rows) == 500
    assert rows == generate_orders()
    first = rows[0]
    assert tuple(first) == COLUMNS
    assert first == {"order_id": "O-0001", "date": "2026-04-17", "region": "EMEA", "product": "Starter",
                     "quantity": 3, "unit_price": 29.0}  # fmt: skip
    assert all(type(row["quantity"]) is int and type(row["unit_price"]) is float for row in rows)
    assert all(type(row["date"]) is str and len(row["date"]) == 10 for row in rows)


def test_load_orders_without_data_says_what_to_do(data_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no orders file at .*orders\.csv; write it with"):
        orders.load_orders()


def test_list_products_and_get_order(orders_dir: Path) -> None:
    assert orders.list_products() == [
        {"product": "Starter", "unit_price": 29.0},
        {"product": "Team", "unit_price": 99.0},
        {"product": "Business", "unit_price": 249.0},
        {"product": "Enterprise", "unit_price": 899.0},
    ]
    assert orders.get_order("O-0500")["order_id"] == "O-0500"
    with pytest.raises(KeyError, match="no order with id 'O-9999'"):
        orders.get_order("O-9999")
    with pytest.raises(TypeError, match="order_id must be a str"):
        orders.get_order(42)  # type: ignore[arg-type]


@pytest.fixture
def notes(data_dir: Path) -> Path:
    (data_dir / "notes").mkdir()
    (data_dir / "notes" / "q3.txt").write_text("Q3 was good.\n")
    (data_dir / "readme.txt").write_text("hello")
    return data_dir


def test_read_text_inside_the_folder(notes: Path) -> None:
    assert files.read_text("notes/q3.txt") == "Q3 was good.\n"
    assert files.read_text("./readme.txt") == "hello"
    assert files.list_files() == ["notes/q3.txt", "readme.txt"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../etc/passwd", "'..' may not be used"),
        ("notes/../../etc/passwd", "'..' may not be used"),
        ("notes/..", "'..' may not be used"),
        ("/etc/passwd", "absolute path '/etc/passwd' refused"),
    ],
)
def test_read_text_refuses_escapes(notes: Path, path: str, message: str) -> None:
    with pytest.raises(PermissionError, match=message):
        files.read_text(path)


def test_read_text_refuses_a_symlink_leading_out(notes: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    os.symlink(secret, notes / "innocent.txt")
    os.symlink(tmp_path, notes / "notes" / "up")
    with pytest.raises(PermissionError, match="leads outside the data folder"):
        files.read_text("innocent.txt")
    with pytest.raises(PermissionError, match="leads outside the data folder"):
        files.read_text("notes/up/secret.txt")
    assert files.list_files() == ["notes/q3.txt", "readme.txt"]  # the escaping links are not listed


def test_read_text_follows_a_symlink_that_stays_inside(notes: Path) -> None:
    os.symlink(notes / "readme.txt", notes / "notes" / "link.txt")
    assert files.read_text("notes/link.txt") == "hello"
    assert "notes/link.txt" in files.list_files()


def test_read_text_argument_checks(notes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match="path must be a str, not list"):
        files.read_text(["readme.txt"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty relative path"):
        files.read_text("")
    with pytest.raises(ValueError, match="non-empty relative path"):
        files.read_text("readme.txt\x00.png")
    with pytest.raises(FileNotFoundError, match=r"no file 'missing\.txt' in the data folder"):
        files.read_text("missing.txt")
    with pytest.raises(IsADirectoryError, match="'notes' is not a regular file"):
        files.read_text("notes")
    (notes / "blob.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match=r"'blob\.bin' is not UTF-8 text"):
        files.read_text("blob.bin")
    monkeypatch.setattr(files, "MAX_READ_BYTES", 3)
    with pytest.raises(ValueError, match=r"'readme\.txt' is 5 bytes; read_text reads at most 3"):
        files.read_text("readme.txt")


def test_send_email_records_and_validates(data_dir: Path) -> None:
    assert side.list_sent_emails() == []
    first = side.send_email("ana@example.com", "Q3 revenue", "See attached.")
    second = side.send_email("bo@example.org", "Again")
    assert first.startswith("msg-") and first != second
    sent = side.list_sent_emails()
    assert [(m["id"], m["to"], m["subject"]) for m in sent] == [
        (first, "ana@example.com", "Q3 revenue"),
        (second, "bo@example.org", "Again"),
    ]
    assert (data_dir / side.OUTBOX_FILENAME).exists()
    for bad in ["not an address", "a@b.com, c@d.com", "a@b.com\nBcc: x@y.com", 7]:
        with pytest.raises(ValueError, match="to must be one email address"):
            side.send_email(bad, "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="subject must be one line"):
        side.send_email("ana@example.com", "hi\r\nBcc: x@y.com")
    assert len(side.list_sent_emails()) == 2


def test_data_dir_is_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_DATA_DIR", "~/elsewhere")
    assert data_dir() == Path("~/elsewhere").expanduser()
