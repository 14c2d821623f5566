// Trajectory page. No build step; the CSP allows no inline script or style, so
// everything here works through classes, attributes and the CSS Custom Highlight API.
//   j / k      next / previous rollout (through the run's filtered list; review.js answers first in review mode)
//   n / p      next / previous step; the outline highlights the step being read
//   /          focus the search box; Enter / Shift-Enter: next / previous hit; Esc leaves it
//   e / c      expand everything / fold every item to one line (c again folds the steps too)
(function () {
  "use strict";
  var q = document.getElementById("traj-q");
  var hitsLabel = document.getElementById("traj-hits");
  var timeline = document.getElementById("timeline");

  function typing(el) {
    if (!el) return false;
    var tag = el.tagName;
    return el.isContentEditable || tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT";
  }

  function openAncestors(el) {
    for (var node = el; node; node = node.parentElement) {
      if (node.tagName === "DETAILS" && !node.open) node.open = true;
    }
  }

  // -- steps and the outline -----------------------------------------------------------------
  function steps() {
    return Array.prototype.slice.call(document.querySelectorAll("#timeline details.step"));
  }
  var currentId = null;
  function setCurrent(id) {
    if (id === currentId) return;
    currentId = id;
    var rows = document.querySelectorAll(".outline-row");
    for (var i = 0; i < rows.length; i++) {
      var on = rows[i].getAttribute("data-target") === id;
      rows[i].classList.toggle("current", on);
      if (on) rows[i].setAttribute("aria-current", "step"); else rows[i].removeAttribute("aria-current");
    }
    var row = document.querySelector('.outline-row[data-target="' + id + '"]');
    var box = document.getElementById("traj-outline");
    if (row && box && box.scrollHeight > box.clientHeight) {
      var r = row.getBoundingClientRect(), b = box.getBoundingClientRect();
      if (r.top < b.top || r.bottom > b.bottom) box.scrollTop += r.top - b.top - b.height / 3;
    }
  }
  // The current step: the last one whose top has passed a line just under the sticky toolbar.
  function computeCurrent() {
    var all = steps();
    if (!all.length) return;
    var line = 80, pick = all[0];
    for (var i = 0; i < all.length; i++) {
      if (all[i].getBoundingClientRect().top <= line) pick = all[i]; else break;
    }
    setCurrent(pick.id);
  }
  var observer = null, pending = false;
  function schedule() {
    if (pending) return;
    pending = true;
    window.requestAnimationFrame(function () { pending = false; computeCurrent(); });
  }
  function observe() {
    if (!("IntersectionObserver" in window)) return;
    if (observer) observer.disconnect();
    var thresholds = [];
    for (var t = 0; t <= 20; t++) thresholds.push(t / 20);
    observer = new IntersectionObserver(schedule, { threshold: thresholds });
    steps().forEach(function (s) { observer.observe(s); });
    computeCurrent();
  }
  function goToStep(delta) {
    var all = steps();
    if (!all.length) return;
    var at = 0;
    for (var i = 0; i < all.length; i++) if (all[i].id === currentId) at = i;
    // at the very top nothing is "read" yet: n goes to the first step after the input
    var target = all[Math.max(0, Math.min(all.length - 1, at + delta))];
    jumpTo(target);
  }
  function jumpTo(el) {
    if (!el) return;
    openAncestors(el);
    if (el.tagName === "DETAILS") el.open = true;
    el.scrollIntoView({ block: "start" });
    setCurrent(el.id);
    if (history.replaceState) history.replaceState(history.state, "", urlWith({ hash: el.id }));
  }
  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest(".outline-row");
    if (!link) return;
    var el = document.getElementById(link.getAttribute("data-target"));
    if (!el) return;
    event.preventDefault();
    jumpTo(el);
  });
  function openHash() {
    var id = decodeURIComponent((location.hash || "").slice(1));
    var el = id && document.getElementById(id);
    if (el) { openAncestors(el); el.scrollIntoView({ block: "start" }); }
  }
  window.addEventListener("hashchange", openHash);

  // -- images: an inline image the agent saw grows to its full size on click, and back --------
  document.addEventListener("click", function (event) {
    var img = event.target.closest && event.target.closest("img.part-img");
    if (img) img.classList.toggle("enlarged");
  });

  // -- copy: an item's whole text (from its raw JSON, past the display cut) or one argument's or
  // code block's text, never the HTML --------------------------------------------------------
  function itemText(item) {
    function texts(content) {
      if (typeof content === "string") return content;
      if (!Array.isArray(content)) return content == null ? "" : JSON.stringify(content, null, 2);
      return content.map(function (part) {
        if (typeof part === "string") return part;
        if (part && typeof part.text === "string") return part.text;
        if (part && typeof part.refusal === "string") return part.refusal;
        return JSON.stringify(part, null, 2);
      }).join("\n");
    }
    if (!item || typeof item !== "object") return JSON.stringify(item, null, 2);
    if (item.type === "function_call") return typeof item.arguments === "string" ? item.arguments : JSON.stringify(item.arguments, null, 2);
    if (item.type === "function_call_output") return texts(item.output);
    if (item.type === "reasoning") return [texts(item.summary || []), texts(item.content || [])].filter(Boolean).join("\n");
    if ("content" in item && (item.type === "message" || item.type === undefined)) return texts(item.content);
    return JSON.stringify(item, null, 2);
  }
  function writeClipboard(text) {
    if (navigator.clipboard && navigator.clipboard.writeText) return navigator.clipboard.writeText(text);
    return new Promise(function (resolve, reject) {
      var area = document.createElement("textarea");
      area.value = text;
      area.setAttribute("readonly", "");
      area.className = "copy-area";
      document.body.appendChild(area);
      area.select();
      var ok = document.execCommand && document.execCommand("copy");
      document.body.removeChild(area);
      if (ok) resolve(); else reject(new Error("copy refused"));
    });
  }
  function copied(button, ok) {
    var label = button.getAttribute("data-label") || button.textContent;
    button.setAttribute("data-label", label);
    button.textContent = ok ? "copied" : "copy failed";
    button.classList.toggle("copy-done", !!ok);
    window.setTimeout(function () { button.textContent = label; button.classList.remove("copy-done"); }, 1500);
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button.copy-btn");
    if (!button) return;
    event.preventDefault();
    event.stopPropagation();
    // an item's button copies the item's stored text: its raw JSON link says where it is
    var raw = button.hasAttribute("data-copy-item") && button.parentElement.querySelector("a.item-raw");
    var url = raw ? raw.getAttribute("href") : "";
    var done = function () { copied(button, true); }, failed = function () { copied(button, false); };
    if (url) {
      fetch(url, { credentials: "same-origin" })
        .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
        .then(function (item) { return writeClipboard(itemText(item)); })
        .then(done, failed);
      return;
    }
    var target = button.parentElement && button.parentElement.querySelector(":scope > pre, :scope > .j-s");
    var holder = target || button.parentElement;
    var text = "";
    if (holder) {
      var clone = holder.cloneNode(true);
      clone.querySelectorAll("button, .elided").forEach(function (b) { b.remove(); });
      text = clone.textContent;
    }
    writeClipboard(text).then(done, failed);
  });
  // a copy button on each argument and each code block or text block of an item body
  // (written here, not by the server: a 500-item page would carry 500 more buttons of markup)
  function addCopyButtons(root) {
    var scope = root || document;
    var raws = scope.querySelectorAll("#timeline .item-tools > a.item-raw, #traj-end .item-tools > a.item-raw");
    for (var j = 0; j < raws.length; j++) {
      var tools = raws[j].parentElement;
      if (tools.querySelector("button.copy-btn")) continue;
      var copy = document.createElement("button");
      copy.type = "button";
      copy.className = "copy-btn copy-item";
      copy.setAttribute("data-copy-item", "");
      copy.textContent = "copy";
      copy.title = "copy this item's whole text";
      tools.appendChild(document.createTextNode(" · "));
      tools.appendChild(copy);
    }
    var spots = scope.querySelectorAll(
      "#timeline .item-body dd.f-v, #timeline .item-body pre, #traj-end .item-body dd.f-v, #traj-end .item-body pre");
    for (var i = 0; i < spots.length; i++) {
      var spot = spots[i], box = spot;
      if (spot.tagName === "PRE") {
        if (spot.parentElement.matches("dd.f-v")) continue;  // the argument's own button copies it
        box = spot.parentElement;
        if (!box.classList.contains("copy-wrap")) {  // each block its own box, so its own button
          box = document.createElement("div");
          box.className = "copy-box copy-wrap";
          spot.parentElement.insertBefore(box, spot);
          box.appendChild(spot);
        }
      }
      if (box.querySelector(":scope > button.copy-btn")) continue;
      var button = document.createElement("button");
      button.type = "button";
      button.className = "copy-btn copy-part";
      button.textContent = "copy";
      button.title = spot.tagName === "PRE" ? "copy this text" : "copy this argument's value";
      box.classList.add("copy-box");
      box.insertBefore(button, box.firstChild);
    }
  }

  // -- bounding boxes: a call whose arguments carry boxes (data-boxes, read by the server) has
  // them drawn over the last image the page shows before it -----------------------------------
  var SVG = "http://www.w3.org/2000/svg";
  function drawBoxes(img, boxes, from) {
    var w = img.naturalWidth, h = img.naturalHeight;
    if (!w || !h) return;
    var wrap = img.parentElement;
    if (!wrap.classList.contains("bbox-wrap")) {
      wrap = document.createElement("span");
      wrap.className = "bbox-wrap";
      img.parentElement.insertBefore(wrap, img);
      wrap.appendChild(img);
    }
    var svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "bbox-svg");
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("data-from", from);
    boxes.forEach(function (b) {
      var sx = b.norm ? w : 1, sy = b.norm ? h : 1;
      var rect = document.createElementNS(SVG, "rect");
      rect.setAttribute("class", "bbox-rect");
      rect.setAttribute("x", b.x1 * sx); rect.setAttribute("y", b.y1 * sy);
      rect.setAttribute("width", (b.x2 - b.x1) * sx); rect.setAttribute("height", (b.y2 - b.y1) * sy);
      rect.setAttribute("vector-effect", "non-scaling-stroke");
      var title = document.createElementNS(SVG, "title");
      title.textContent = (b.label ? b.label + " " : "") + "from " + from;
      rect.appendChild(title);
      svg.appendChild(rect);
    });
    wrap.appendChild(svg);
  }
  function addBoxes() {
    var calls = document.querySelectorAll("#timeline [data-boxes]");
    if (!calls.length) return;
    var imgs = Array.prototype.slice.call(document.querySelectorAll("#timeline img.part-img"));
    for (var i = 0; i < calls.length; i++) {
      var call = calls[i];
      if (call.getAttribute("data-boxes-drawn")) continue;
      var img = null;
      for (var j = 0; j < imgs.length; j++) {
        if (imgs[j].compareDocumentPosition(call) & Node.DOCUMENT_POSITION_FOLLOWING) img = imgs[j];
      }
      if (!img) continue;
      var boxes;
      try { boxes = JSON.parse(call.getAttribute("data-boxes")); } catch (e) { continue; }
      call.setAttribute("data-boxes-drawn", "1");
      var from = call.id ? "#" + call.id.replace(/^.*item-/, "") : "a call";
      if (img.complete && img.naturalWidth) drawBoxes(img, boxes, from);
      else img.addEventListener("load", drawBoxes.bind(null, img, boxes, from), { once: true });
    }
  }

  // -- folding --------------------------------------------------------------------------------
  function expandAll() {
    // steps, sub-groups, folded items and the reasoning / thinking inside them
    var all = document.querySelectorAll(
      "#timeline details.step, #timeline details.substep, #timeline details.fold, " +
      "#timeline details.reasoning, #timeline details.think");
    for (var i = 0; i < all.length; i++) all[i].open = true;
  }
  function collapseAll() {
    var folds = document.querySelectorAll("#timeline details.fold");
    var anyOpen = false;
    for (var i = 0; i < folds.length; i++) if (folds[i].open) { anyOpen = true; folds[i].open = false; }
    if (!anyOpen) {  // every item was folded already: fold the steps too
      var all = steps().concat(Array.prototype.slice.call(document.querySelectorAll("#timeline details.substep"))).concat(Array.prototype.slice.call(document.querySelectorAll("#step-input")));
      for (var j = 0; j < all.length; j++) all[j].open = false;
    }
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("[data-fold]");
    if (!button) return;
    if (button.getAttribute("data-fold") === "expand") expandAll(); else collapseAll();
    schedule();
  });

  // -- search ---------------------------------------------------------------------------------
  var hits = [], at = -1, marks = [];
  var useHighlights = typeof CSS !== "undefined" && CSS.highlights && typeof Highlight === "function";
  function urlWith(change) {
    var url = new URL(location.href);
    if ("q" in change) { if (change.q) url.searchParams.set("q", change.q); else url.searchParams.delete("q"); }
    if ("hash" in change) url.hash = change.hash ? "#" + change.hash : "";
    return url.pathname + url.search + url.hash;
  }
  function clearMarks() {
    if (useHighlights) { CSS.highlights.delete("traj-hit"); CSS.highlights.delete("traj-hit-current"); }
    marks.forEach(function (m) {
      var parent = m.parentNode;
      if (!parent) return;
      parent.replaceChild(document.createTextNode(m.textContent), m);
      parent.normalize();
    });
    marks = [];
  }
  function searchRoots() {
    return [timeline, document.getElementById("traj-end")].filter(Boolean);
  }
  // -- find past the display cut: the server searches every item's whole stored text; an item
  // whose cut hides hits gets its full body (the item endpoint's ?full=1) and the search runs again
  var findUrl = q && q.form && q.form.getAttribute("data-find");
  var findToken = 0;
  function hitsIn(el) {
    var n = 0;
    for (var i = 0; i < hits.length; i++) if (el.contains(hits[i].node)) n++;
    return n;
  }
  function loadFull(body, href) {
    return fetch(href, { credentials: "same-origin", headers: { "HX-Request": "true" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null || !body.parentNode) return;
        var holder = document.createElement("div");
        holder.innerHTML = html;
        var fresh = holder.firstElementChild;
        if (!fresh) return;
        body.parentNode.replaceChild(fresh, body);
        if (window.htmx) window.htmx.process(fresh);
        addCopyButtons();
      });
  }
  function findPastCut(text, keepPosition) {
    if (!findUrl || !window.fetch) return;
    var token = ++findToken;
    fetch(findUrl + "?q=" + encodeURIComponent(text), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (token !== findToken) return;
        var loads = [];
        (data && data.items || []).forEach(function (found) {
          var body = document.getElementById(found.key === "verify" ? "verify" : "body-" + found.key);
          var more = body && body.querySelector(".item-tools a.show-all");
          if (!more || hitsIn(body) >= found.hits) return;
          loads.push(loadFull(body, more.getAttribute("href")));
        });
        return Promise.all(loads).then(function () {
          if (token !== findToken) return;
          if (loads.length) search(text, keepPosition && hits.length > 0, true);
          else if (!hits.length) hitsLabel.textContent = "no match";
        });
      })
      .catch(function () { if (!hits.length) hitsLabel.textContent = "no match"; });
  }
  function search(text, keepPosition, skipFind) {
    var previous = at;
    clearMarks();
    hits = []; at = -1;
    var needle = (text || "").toLowerCase();
    if (!needle) { findToken++; hitsLabel.textContent = ""; return; }
    searchRoots().forEach(function (root) {
      var walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
        acceptNode: function (node) {
          // a folded item's one-line summary (and a step's or group's) repeats its text: count each hit once, in the item
          var p = node.parentElement;
          return p && !p.closest("summary.fold-sum, summary.substep-sum, .step-gist, button") ?
            NodeFilter.FILTER_ACCEPT : NodeFilter.FILTER_REJECT;
        }
      });
      // highlighted code splits a line into token spans: the text nodes of one code block are
      // searched as one text, so a hit may span tokens ("ls -la")
      var run = [], runBlock = null, node;
      function flush() {
        if (!run.length) return;
        var hay = "", starts = [];
        run.forEach(function (n) { starts.push(hay.length); hay += n.data; });
        hay = hay.toLowerCase();
        var from = 0, i, k = 0;
        function at(offset, end) {  // (node, offset) of a character offset into the run
          while (k < run.length - 1 && (end ? starts[k + 1] < offset : starts[k + 1] <= offset)) k++;
          return { node: run[k], offset: offset - starts[k] };
        }
        while ((i = hay.indexOf(needle, from)) !== -1) {
          k = 0;
          var a = at(i, false), b = at(i + needle.length, true);
          hits.push({ node: a.node, start: a.offset, endNode: b.node, end: b.offset });
          from = i + needle.length;
        }
        run = [];
      }
      while ((node = walker.nextNode())) {
        var block = node.parentElement.closest("pre.hl");
        if (!block || block !== runBlock) flush();
        runBlock = block;
        run.push(node);
        if (!block) flush();
      }
      flush();
    });
    if (!useHighlights) {
      // wrap from the end of each node backwards so earlier offsets stay valid
      for (var h = hits.length - 1; h >= 0; h--) {
        var hit = hits[h], r = document.createRange();
        // without the Highlight API a hit across token spans is marked in its first one
        r.setStart(hit.node, hit.start);
        r.setEnd(hit.node, hit.endNode === hit.node ? hit.end : hit.node.data.length);
        var mark = document.createElement("mark");
        mark.className = "traj-hit";
        r.surroundContents(mark);
        hit.mark = mark;
        marks.unshift(mark);
      }
    } else {
      var ranges = hits.map(function (hit) {
        var r = document.createRange();
        r.setStart(hit.node, hit.start); r.setEnd(hit.endNode, hit.end);
        hit.range = r;
        return r;
      });
      var all = new Highlight();
      ranges.forEach(function (r) { all.add(r); });
      CSS.highlights.set("traj-hit", all);
    }
    // every folded step or item holding a hit opens
    hits.forEach(function (hit) { openAncestors(hit.node.parentElement); });
    if (!skipFind && findUrl) findPastCut(text, keepPosition);
    if (!hits.length) { hitsLabel.textContent = !skipFind && findUrl ? "searching the full text…" : "no match"; return; }
    move(keepPosition && previous >= 0 ? Math.min(previous, hits.length - 1) : 0, true, !keepPosition);
  }
  // a hit deep in a long text: its element's centre is not the hit; bring the range itself into
  // the middle of every scrolling box around it and of the window
  function reveal(range, el) {
    for (var node = el; node && node !== document.body; node = node.parentElement) {
      if (node.scrollHeight > node.clientHeight + 1 && /(auto|scroll)/.test(getComputedStyle(node).overflowY)) {
        var r = range.getBoundingClientRect(), b = node.getBoundingClientRect();
        node.scrollTop += r.top - b.top - b.height / 2;
      }
    }
    var rect = range.getBoundingClientRect();
    window.scrollBy(0, rect.top - window.innerHeight / 2);
  }
  function move(index, absolute, scroll) {
    if (!hits.length) return;
    at = absolute ? index : (at + index + hits.length) % hits.length;
    var hit = hits[at];
    if (useHighlights) {
      CSS.highlights.set("traj-hit-current", new Highlight(hit.range));
    } else {
      marks.forEach(function (m) { m.classList.remove("current"); });
      hit.mark.classList.add("current");
    }
    hitsLabel.textContent = (at + 1) + " of " + hits.length;
    if (scroll !== false) {
      var el = hit.mark || hit.node.parentElement;
      openAncestors(el);
      el.scrollIntoView({ block: "center" });
      if (hit.range) reveal(hit.range, el);
    }
  }
  var timer = null;
  if (q) {
    q.addEventListener("input", function () {
      window.clearTimeout(timer);
      timer = window.setTimeout(function () {
        search(q.value);
        if (history.replaceState) history.replaceState(history.state, "", urlWith({ q: q.value }));
      }, 150);
    });
    q.addEventListener("keydown", function (event) {
      if (event.key === "Enter") {
        event.preventDefault();
        window.clearTimeout(timer);
        if (!hits.length || q.getAttribute("data-searched") !== q.value) {
          q.setAttribute("data-searched", q.value);
          search(q.value);
          if (history.replaceState) history.replaceState(history.state, "", urlWith({ q: q.value }));
          if (event.shiftKey && hits.length) move(hits.length - 1, true);
        } else {
          move(event.shiftKey ? -1 : 1, false);
        }
      } else if (event.key === "Escape") {
        q.blur();
      }
    });
    q.form.addEventListener("submit", function (event) { event.preventDefault(); });
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("[data-search]");
    if (!button) return;
    if (!hits.length && q && q.value) search(q.value);
    move(button.getAttribute("data-search") === "prev" ? -1 : 1, false);
  });

  // -- keys -----------------------------------------------------------------------------------
  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.altKey || event.ctrlKey || event.metaKey) return;
    if (typing(event.target)) return;
    var key = event.key;
    if (key === "/" ) {
      if (q) { event.preventDefault(); q.focus(); q.select(); }
      return;
    }
    if (event.shiftKey) return;
    if (key === "j" || key === "k") {
      var link = document.querySelector('a[data-nav="' + (key === "j" ? "next" : "prev") + '"]');
      if (link && link.href) { event.preventDefault(); window.location.assign(link.href); }
    } else if (key === "n" || key === "p") {
      event.preventDefault();
      goToStep(key === "n" ? 1 : -1);
    } else if (key === "e") {
      event.preventDefault(); expandAll(); schedule();
    } else if (key === "c") {
      event.preventDefault(); collapseAll(); schedule();
    }
  });

  // -- live tail: new steps arrive by HTMX; re-observe them and re-run the search ---------------
  document.body.addEventListener("htmx:afterSettle", function (event) {
    var target = event.detail && event.detail.elt;
    if (!target || !(target.id === "traj-tail" || target.closest && target.closest("#timeline"))) {
      if (!document.getElementById("timeline")) return;
    }
    observe();
    addCopyButtons();
    addBoxes();
    if (q && q.value) search(q.value, true);
  });

  // narrow screens: the outline starts folded above the trajectory
  var box = document.getElementById("outline-box");
  if (box && window.matchMedia && window.matchMedia("(max-width: 900px)").matches) box.open = false;

  observe();
  addCopyButtons();
  addBoxes();
  window.addEventListener("scroll", schedule, { passive: true });
  if (location.hash) openHash();
  if (q && q.value) search(q.value);
})();
