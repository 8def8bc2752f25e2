// wallfinder report: draws the plots from #wf-figures and makes tables sortable. It reads only
// this page; it computes no figure (each number comes from the diagnosis).
(function () {
  "use strict";

  function drawPlots() {
    var figures = JSON.parse(document.getElementById("wf-figures").textContent);
    var config = {
      displaylogo: false,
      responsive: true,
      typesetMath: false,
      showLink: false,
      modeBarButtonsToRemove: ["select2d", "lasso2d"],
    };
    var jobs = [];
    Object.keys(figures).forEach(function (id) {
      var el = document.getElementById(id);
      if (el) {
        jobs.push(Plotly.newPlot(el, figures[id].data, figures[id].layout, config));
      }
    });
    return Promise.all(jobs);
  }

  function cellValue(row, index, numeric) {
    var cell = row.cells[index];
    if (!cell) {
      return numeric ? -Infinity : "";
    }
    if (numeric) {
      var v = parseFloat(cell.getAttribute("data-v"));
      return isNaN(v) ? -Infinity : v;
    }
    return cell.textContent.trim().toLowerCase();
  }

  function makeSortable(table) {
    var headers = table.tHead ? table.tHead.rows[0].cells : [];
    Array.prototype.forEach.call(headers, function (th, index) {
      th.addEventListener("click", function () {
        var numeric = th.getAttribute("data-sort") === "num";
        var descending = th.getAttribute("aria-sort") !== "descending";
        Array.prototype.forEach.call(headers, function (h) {
          h.removeAttribute("aria-sort");
        });
        th.setAttribute("aria-sort", descending ? "descending" : "ascending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = cellValue(a, index, numeric);
          var y = cellValue(b, index, numeric);
          var order = x < y ? -1 : x > y ? 1 : 0;
          return descending ? -order : order;
        });
        rows.forEach(function (row) {
          body.appendChild(row);
        });
      });
    });
  }

  document.querySelectorAll("table.sortable").forEach(makeSortable);
  var done = function (state) {
    document.body.setAttribute("data-plots", state);
  };
  if (typeof Plotly === "undefined") {
    done("unavailable");
    return;
  }
  drawPlots().then(
    function () {
      done("ready");
    },
    function (error) {
      done("failed");
      console.error("wallfinder: a plot failed to draw", error);
    }
  );
})();
