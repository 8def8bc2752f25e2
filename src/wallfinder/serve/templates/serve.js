// wallfinder serve: filters and pages the tables the report's script sorts, and keeps the run
// list (and a run waiting for its diagnosis) fresh by asking the app. It computes no figure.
(function () {
  "use strict";

  var PAGE_ROWS = 25;
  var POLL_MS = 2000;

  function tableTools(table) {
    var body = table.tBodies[0];
    if (!body) {
      return;
    }
    var state = { page: 0, filter: "" };
    var tools = document.createElement("div");
    tools.className = "table-tools";
    var input = document.createElement("input");
    input.type = "search";
    input.placeholder = "filter rows";
    input.setAttribute("aria-label", "filter rows");
    var prev = document.createElement("button");
    prev.textContent = "‹";
    prev.setAttribute("aria-label", "previous page");
    var next = document.createElement("button");
    next.textContent = "›";
    next.setAttribute("aria-label", "next page");
    var info = document.createElement("span");
    info.className = "page-info";
    tools.append(input, prev, info, next);
    table.parentNode.insertBefore(tools, table);

    function apply() {
      var rows = Array.prototype.slice.call(body.rows);
      var needle = state.filter.toLowerCase();
      var kept = rows.filter(function (row) {
        return !needle || row.textContent.toLowerCase().indexOf(needle) !== -1;
      });
      var pages = Math.max(1, Math.ceil(kept.length / PAGE_ROWS));
      state.page = Math.min(state.page, pages - 1);
      rows.forEach(function (row) {
        row.hidden = true;
      });
      kept.slice(state.page * PAGE_ROWS, (state.page + 1) * PAGE_ROWS).forEach(function (row) {
        row.hidden = false;
      });
      info.textContent =
        kept.length + " of " + rows.length + " rows" + (pages > 1 ? ", page " + (state.page + 1) + " of " + pages : "");
      prev.disabled = state.page === 0;
      next.disabled = state.page >= pages - 1;
    }
    input.addEventListener("input", function () {
      state.filter = input.value;
      state.page = 0;
      apply();
    });
    prev.addEventListener("click", function () {
      state.page -= 1;
      apply();
    });
    next.addEventListener("click", function () {
      state.page += 1;
      apply();
    });
    // The report's script sorts on a header click (its listener runs first): page again.
    if (table.tHead) {
      table.tHead.addEventListener("click", apply);
    }
    apply();
  }

  function poll(check) {
    var ask = function () {
      fetch("/api/runs", { cache: "no-store" })
        .then(function (r) {
          return r.json();
        })
        .then(function (data) {
          if (check(data)) {
            window.location.reload();
          } else {
            window.setTimeout(ask, POLL_MS);
          }
        })
        .catch(function () {
          window.setTimeout(ask, POLL_MS * 5); // the server stopped: try again, slower
        });
    };
    window.setTimeout(ask, POLL_MS);
  }

  // The tables the report makes sortable are its long ones: those get a filter and pages.
  document.querySelectorAll("main table.sortable").forEach(tableTools);

  var page = document.body.getAttribute("data-page");
  if (page === "index") {
    var stamp = document.getElementById("runs").getAttribute("data-stamp");
    poll(function (data) {
      return data.stamp !== stamp;
    });
  } else if (page === "pending") {
    var pending = document.getElementById("run-pending");
    if (pending) {
      var name = pending.getAttribute("data-run");
      poll(function (data) {
        return data.runs.some(function (r) {
          return r.name === name && (r.state === "ready" || r.state === "error");
        });
      });
    }
  } else if (page === "run") {
    var shown = Array.prototype.some.call(document.querySelectorAll("main > section"), function (s) {
      return s.id !== "verdict" && s.id !== "empty-view" && s.offsetParent !== null;
    });
    document.getElementById("empty-view").hidden = shown;
  }
})();
